//! Planning a request: the rules that count it, each with the request's key and cost, written
//! into a [`Plan`] the caller keeps (inline for the usual few rules and short keys: planning a
//! request allocates nothing); and the rules that would mitigate it.

use std::net::IpAddr;

use smallvec::SmallVec;

use crate::Request;
use crate::asn::AsnDb;
use crate::route::RequestPath;
use crate::rules::{Characteristic, Cost, OnBadCost, OnMissing, Rule, Rules};

/// A rule that applies to a request, with the request's key and cost under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The rule's index in [`Rules::rules`].
    pub rule: usize,
    /// The store key: the characteristics' values (one part: as is; several: each as `LEN:VALUE`).
    pub key: Vec<u8>,
    /// The request's cost under the rule.
    pub cost: u64,
}

/// Keys being written: inline for the usual few short keys (no allocation).
pub type KeyBuf = SmallVec<[u8; 128]>;

/// The rules that apply to one request, each with its key and cost, held inline for the usual
/// few rules and short keys: planning a request allocates nothing.
#[derive(Debug, Default)]
pub struct Plan {
    items: SmallVec<[(usize, u32, u32, u64); 4]>,
    keys: KeyBuf,
}

impl Plan {
    /// The rules that apply: `(rule index, key, cost)`, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[u8], u64)> + '_ {
        self.items.iter().map(|&(rule, start, end, cost)| (rule, &self.keys[start as usize..end as usize], cost))
    }

    /// How many rules apply.
    #[must_use]
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The only rule that applies, if exactly one does.
    #[must_use]
    pub fn single(&self) -> Option<(usize, &[u8], u64)> {
        match self.items.as_slice() {
            [(rule, start, end, cost)] => Some((*rule, &self.keys[*start as usize..*end as usize], *cost)),
            _ => None,
        }
    }

    fn clear(&mut self) {
        self.items.clear();
        self.keys.clear();
    }

    /// Whether no rule applies.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Adds `rule`'s key, written by `write` at the end of the buffer, unless `write` says the
    /// rule does not apply (false) or fails (then nothing is kept either).
    fn push_with<E>(
        &mut self,
        rule: usize,
        write: impl FnOnce(&mut KeyBuf) -> Result<bool, E>,
        cost: impl FnOnce() -> Result<u64, E>,
    ) -> Result<(), E> {
        let start = self.keys.len();
        let kept = write(&mut self.keys).and_then(|applies| Ok(if applies { Some(cost()?) } else { None }));
        match kept {
            Ok(Some(cost)) => {
                // Keys are bounded by the request's head, far below 4 GiB.
                let (from, to) =
                    (u32::try_from(start).unwrap_or(u32::MAX), u32::try_from(self.keys.len()).unwrap_or(u32::MAX));
                self.items.push((rule, from, to, cost));
                Ok(())
            }
            other => {
                self.keys.truncate(start);
                other.map(|_| ())
            }
        }
    }
}

/// A request the rules refuse before any store is asked (a bad cost header, a missing key part
/// under `on_missing = "reject"`): answered 400 with the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RequestError(pub String);

impl Rules {
    /// The rules that count `request`, with its key and cost under each. A rule lacking a key
    /// part or a usable cost is skipped, shares a key, or refuses the request, as it says.
    /// Written into `plan` (cleared first), which the caller keeps: a plan is a few hundred
    /// bytes inline, not worth moving on every request.
    pub fn plan(&self, request: &Request<'_>, plan: &mut Plan) -> Result<(), RequestError> {
        plan.clear();
        let path = RequestPath::new(request.path);
        let mut asn = Asn::new(self.asn_db.as_deref());
        for (index, rule) in self.rules.iter().enumerate() {
            if rule.matcher.matches(request, &path, rule.path_match) {
                plan.push_with(index, |keys| rule.key_into(request, &path, &mut asn, keys), || rule.cost_for(request))?;
            }
        }
        Ok(())
    }

    /// The plan of a caller naming rule `rule` and its key (`TG.LIMIT name key`, HTTP
    /// `limit_name`): that rule alone, keyed on `key`, at `cost`.
    pub fn plan_named(&self, rule: usize, key: &[u8], cost: u64, plan: &mut Plan) {
        plan.clear();
        let _ = plan.push_with(
            rule,
            |keys| {
                keys.extend_from_slice(key);
                Ok::<_, RequestError>(true)
            },
            || Ok(cost),
        );
    }

    /// [`plan`](Self::plan), as owned values.
    pub fn counting(&self, request: &Request<'_>) -> Result<Vec<Applied>, RequestError> {
        let mut plan = Plan::default();
        self.plan(request, &mut plan)?;
        Ok(plan.iter().map(|(rule, key, cost)| Applied { rule, key: key.to_vec(), cost }).collect())
    }

    /// The rules that would mitigate `request` if its key were over, with its key under each.
    pub fn mitigating_plan(&self, request: &Request<'_>, plan: &mut Plan) {
        plan.clear();
        let path = RequestPath::new(request.path);
        let mut asn = Asn::new(self.asn_db.as_deref());
        for (index, rule) in self.rules.iter().enumerate() {
            if rule.mitigation_matcher.matches(request, &path, rule.path_match) {
                // A key that cannot be written (on_missing = "reject") has no mitigation either.
                let _ = plan.push_with(
                    index,
                    |keys| rule.key_into(request, &path, &mut asn, keys),
                    || Ok::<_, RequestError>(0),
                );
            }
        }
    }

    /// [`mitigating_plan`](Self::mitigating_plan), as owned values.
    #[must_use]
    pub fn mitigating(&self, request: &Request<'_>) -> Vec<Applied> {
        let mut plan = Plan::default();
        self.mitigating_plan(request, &mut plan);
        plan.iter().map(|(rule, key, cost)| Applied { rule, key: key.to_vec(), cost }).collect()
    }
}

/// The client address's AS number, looked up once per request, when a rule first keys on it.
pub struct Asn<'d> {
    db: Option<&'d AsnDb>,
    looked_up: Option<Option<u32>>,
    text: [u8; 10],
}

impl<'d> Asn<'d> {
    /// Looks up in `db` (none: every request lacks an AS number).
    #[must_use]
    pub fn new(db: Option<&'d AsnDb>) -> Self {
        Asn { db, looked_up: None, text: [0; 10] }
    }

    /// The AS number of `ip` in decimal, if the database has one.
    fn of(&mut self, ip: IpAddr) -> Option<&[u8]> {
        let db = self.db;
        let asn = (*self.looked_up.get_or_insert_with(|| db.and_then(|db| db.lookup(ip))))?;
        let at = decimal(&mut self.text, u64::from(asn));
        Some(&self.text[at..])
    }
}

impl Rule {
    /// Appends the store key of `request` (whose path is `path`) to `out`: the
    /// characteristics' values, each as `LEN:VALUE` when there are several. False if the rule
    /// does not apply (a missing part under `on_missing = "skip"`); what was appended then is
    /// the caller's to drop. `asn` looks up the client's AS number (once per request).
    pub fn key_into(
        &self,
        request: &Request<'_>,
        path: &RequestPath<'_>,
        asn: &mut Asn<'_>,
        out: &mut KeyBuf,
    ) -> Result<bool, RequestError> {
        let framed = self.key.len() > 1;
        let ambiguous = |e: crate::Ambiguous| RequestError(format!("{e} (rule {:?} keys on it)", self.name));
        for part in &self.key {
            let text: std::borrow::Cow<'_, str>;
            let decoded: std::borrow::Cow<'_, [u8]>;
            let mut address = IpText::default();
            let value: Option<&[u8]> = match part {
                Characteristic::ClientIp => Some(address.write(request.client_ip, self.ipv6_prefix)),
                Characteristic::Method => {
                    text = crate::canonical::method_key(request.method);
                    Some(text.as_bytes())
                }
                Characteristic::Path => Some(path.key(self.path_match).as_bytes()),
                Characteristic::Global => Some(b""),
                Characteristic::Key => request.key,
                Characteristic::Ja3 => request.ja3.map(str::as_bytes),
                Characteristic::Ja4 => request.ja4.map(str::as_bytes),
                Characteristic::Asn => asn.of(request.client_ip),
                Characteristic::Header(name) => request.header(name).map_err(ambiguous)?,
                Characteristic::Cookie(name) => request.cookie(name).map_err(ambiguous)?,
                Characteristic::Query(name) => match request.query_param(name).map_err(ambiguous)? {
                    Some(value) => {
                        decoded = value;
                        Some(&decoded)
                    }
                    None => None,
                },
            };
            let value = match (value, self.on_missing) {
                (Some(value), _) => value,
                (None, OnMissing::Skip) => return Ok(false),
                (None, OnMissing::Shared) => b"",
                (None, OnMissing::Reject) => {
                    return Err(RequestError(format!(
                        "rule {:?} needs {} and the request has none",
                        self.name,
                        describe(part)
                    )));
                }
            };
            if framed {
                write_decimal(out, value.len() as u64);
                out.push(b':');
            }
            out.extend_from_slice(value);
        }
        Ok(true)
    }

    /// The cost of `request` under this rule: the fixed cost, or the cost header's value (an
    /// integer from 1 to the capacity; otherwise as `on_bad_cost` says, never a peek). The header
    /// is taken as it is from a trusted proxy only (which computed it); from any other peer it can
    /// raise the rule's `cost`, never lower it: a client does not set its own price.
    pub fn cost_for(&self, request: &Request<'_>) -> Result<u64, RequestError> {
        let name = match &self.cost {
            Cost::Fixed(cost) | Cost::Response { estimate: cost, estimate_from: None, .. } => return Ok(*cost),
            Cost::Response { estimate, estimate_from: Some(field), .. } => {
                // Client-chosen, and only a reservation: the response settles what it cost.
                let said = request.header(field.pseudo_header()).ok().flatten();
                let said = said.and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.parse::<u64>().ok());
                return Ok(said.filter(|&n| n > 0).map_or(*estimate, |n| n.min(self.limit.capacity())));
            }
            Cost::Header(name) => name,
        };
        let capacity = self.limit.capacity();
        // Lines that differ, or a value that is not a number, are a bad cost.
        let parsed = match request.header(name) {
            Ok(value) => value
                .map(|v| std::str::from_utf8(v).map_err(|_| ()).and_then(|v| v.trim().parse::<u64>().map_err(|_| ()))),
            Err(_) => Some(Err(())),
        };
        let floor = if request.from_trusted_proxy { 1 } else { self.default_cost };
        match (parsed, self.on_bad_cost) {
            (Some(Ok(cost)), _) if (1..=capacity).contains(&cost) => Ok(cost.max(floor)),
            (Some(Ok(cost)), OnBadCost::Default) if cost > capacity => Ok(capacity),
            (_, OnBadCost::Default) => Ok(self.default_cost),
            (_, OnBadCost::Reject) => Err(RequestError(format!(
                "header {name} must hold the request's cost, an integer from 1 to {capacity} (rule {:?})",
                self.name
            ))),
        }
    }
}

/// `n` in decimal, appended to `out`.
fn write_decimal(out: &mut KeyBuf, n: u64) {
    let mut digits = [0u8; 20];
    let at = decimal(&mut digits, n);
    out.extend_from_slice(&digits[at..]);
}

/// Writes `n` in decimal at the end of `digits`; returns where it starts.
fn decimal(digits: &mut [u8], mut n: u64) -> usize {
    let mut at = digits.len();
    loop {
        at -= 1;
        // A remainder below 10.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return at;
        }
    }
}

/// Each octet's decimal digits (padded to 3 bytes) and how many there are: an IPv4 key is on
/// every request, and four table reads beat dividing.
const OCTETS: [([u8; 3], u8); 256] = {
    let mut table = [([0u8; 3], 0u8); 256];
    let (mut index, mut octet) = (0, 0u8);
    while index < 256 {
        let (h, t, o) = (octet / 100, octet / 10 % 10, octet % 10);
        table[index] = match octet {
            0..=9 => ([b'0' + o, 0, 0], 1),
            10..=99 => ([b'0' + t, b'0' + o, 0], 2),
            _ => ([b'0' + h, b'0' + t, b'0' + o], 3),
        };
        index += 1;
        octet = octet.wrapping_add(1);
    }
    table
};

/// An address as text, on the stack (IPv4 without the formatting machinery: it is on every
/// request).
struct IpText {
    bytes: [u8; 50],
    len: usize,
}

impl Default for IpText {
    fn default() -> Self {
        IpText { bytes: [0; 50], len: 0 }
    }
}

impl IpText {
    /// `ip` as a key: an IPv4 address (IPv4-mapped IPv6 included) whole, an IPv6 one as its
    /// network of `ipv6_prefix` bits (`2001:db8:1:2::/64`; 128: the address).
    fn write(&mut self, ip: IpAddr, ipv6_prefix: u8) -> &[u8] {
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let mut len = 0;
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        self.bytes[len] = b'.';
                        len += 1;
                    }
                    let (digits, n) = OCTETS[usize::from(octet)];
                    self.bytes[len..len + 3].copy_from_slice(&digits);
                    len += usize::from(n);
                }
                self.len = len;
            }
            IpAddr::V6(v6) => {
                let mut cursor = std::io::Cursor::new(&mut self.bytes[..]);
                // An IPv6 address is at most 45 bytes of text, "/128" 4 more.
                let _ = if ipv6_prefix >= 128 {
                    std::io::Write::write_fmt(&mut cursor, format_args!("{v6}"))
                } else {
                    let mask = u128::MAX.checked_shl(128 - u32::from(ipv6_prefix)).unwrap_or(0);
                    let network = std::net::Ipv6Addr::from(u128::from(v6) & mask);
                    std::io::Write::write_fmt(&mut cursor, format_args!("{network}/{ipv6_prefix}"))
                };
                self.len = usize::try_from(cursor.position()).unwrap_or(0);
            }
        }
        &self.bytes[..self.len]
    }
}

fn describe(part: &Characteristic) -> String {
    match part {
        Characteristic::Header(name) => format!("header {name}"),
        Characteristic::Cookie(name) => format!("cookie {name}"),
        Characteristic::Query(name) => format!("query parameter {name}"),
        Characteristic::Key => "a key".into(),
        Characteristic::Ja3 | Characteristic::Ja4 => format!("{part:?} (a TLS connection)").to_lowercase(),
        Characteristic::Asn => "an AS number (the client address is in no range of asn_db)".into(),
        other => format!("{other:?}"),
    }
}
