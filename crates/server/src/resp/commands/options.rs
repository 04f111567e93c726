//! The `TG.*` commands' syntax: each command's name and usage, and its `[NAME value]` options,
//! parsed by name so that every refusal says which command refused what, and what it takes.
//!
//! Options are case-insensitive and in any order; each at most once (a repeated one is an error
//! naming it: the first and the last would both be plausible, and a client sending two has a bug).

use super::args::{integer_arg, shown};

/// An option of the `TG.*` commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Opt {
    /// `BURST b`: the bucket family's capacity.
    Burst,
    /// `SLICES s`: the sub-window counter's slices.
    Slices,
    /// `COST c`: what the request consumes.
    Cost,
    /// `TZ zone`: the IANA time zone of a calendar period (text, not a number).
    Tz,
}

/// The longest `TZ` value taken: IANA names are at most 30-odd bytes.
const MAX_ZONE_BYTES: usize = 64;

impl Opt {
    const ALL: [Opt; 4] = [Opt::Burst, Opt::Slices, Opt::Cost, Opt::Tz];

    fn name(self) -> &'static str {
        match self {
            Opt::Burst => "BURST",
            Opt::Slices => "SLICES",
            Opt::Cost => "COST",
            Opt::Tz => "TZ",
        }
    }

    fn placeholder(self) -> &'static str {
        match self {
            Opt::Burst => "<b>",
            Opt::Slices => "<s>",
            Opt::Cost => "<c>",
            Opt::Tz => "<zone>",
        }
    }

    /// The smallest value: a cost may be 0 (a peek), a burst or slice count may not.
    fn min(self) -> i64 {
        if self == Opt::Cost { 0 } else { 1 }
    }
}

/// What one command takes.
#[derive(Debug)]
pub(super) struct Syntax {
    /// The command, as messages name it.
    pub(super) name: &'static str,
    /// Its wrong-arity reply.
    pub(super) usage: &'static str,
    /// Arguments before the options.
    pub(super) positional: usize,
    /// The options it takes.
    pub(super) takes: &'static [Opt],
    /// Those options, as messages list them.
    pub(super) listed: &'static str,
    /// Why it takes no other known option.
    pub(super) refuses_because: &'static str,
}

pub(super) const CHECK: Syntax = Syntax {
    name: "TG.CHECK",
    usage: "ERR Usage: TG.CHECK <key> <algorithm> <count> <period_ms|day|week|month|year> [BURST <b>] [SLICES <s>] \
            [COST <c>] [TZ <zone>]",
    positional: 4,
    takes: &[Opt::Burst, Opt::Slices, Opt::Cost, Opt::Tz],
    listed: "BURST, SLICES, COST, TZ",
    refuses_because: "",
};

pub(super) const PEEK: Syntax = Syntax {
    name: "TG.PEEK",
    usage: "ERR Usage: TG.PEEK <key> <algorithm> <count> <period_ms|day|week|month|year> [BURST <b>] [SLICES <s>] \
            [TZ <zone>]",
    takes: &[Opt::Burst, Opt::Slices, Opt::Tz],
    listed: "BURST, SLICES, TZ",
    refuses_because: "a peek never consumes",
    ..CHECK
};

pub(super) const RESET: Syntax = Syntax {
    name: "TG.RESET",
    usage: "ERR Usage: TG.RESET <key> <algorithm> <count> <period_ms|day|week|month|year> [BURST <b>] [SLICES <s>] \
            [TZ <zone>]",
    refuses_because: "a reset consumes nothing",
    ..PEEK
};

pub(super) const LIMIT: Syntax = Syntax {
    name: "TG.LIMIT",
    usage: "ERR Usage: TG.LIMIT <name> <key> [COST <c>]",
    positional: 2,
    takes: &[Opt::Cost],
    listed: "COST",
    refuses_because: "the limit's parameters are in the rules file",
};

/// A run of a command's arguments.
type Args<'a, 'b> = &'b [&'a [u8]];

/// The options' values: the numbers by [`Opt`], the zone apart.
#[derive(Debug, Default)]
pub(super) struct Options<'a> {
    numbers: [Option<u64>; 3],
    tz: Option<&'a str>,
}

impl<'a> Options<'a> {
    /// A number option's value (`None` for `TZ`, see [`tz`](Self::tz)).
    pub(super) fn get(&self, opt: Opt) -> Option<u64> {
        self.numbers.get(opt as usize).copied().flatten()
    }

    /// The `TZ` option's value.
    pub(super) fn tz(&self) -> Option<&'a str> {
        self.tz
    }
}

impl Syntax {
    /// `args` split into the positional arguments and the options, or the usage to reply. The
    /// caller checks the positional ones first: a missing one shifts an option into their place.
    pub(super) fn split<'a, 'b>(&self, args: &'b [&'a [u8]]) -> Result<(Args<'a, 'b>, Args<'a, 'b>), String> {
        if args.len() < self.positional {
            return Err(self.usage.into());
        }
        Ok(args.split_at(self.positional))
    }

    /// The options after the positional arguments, or the error to reply.
    pub(super) fn options<'a>(&self, mut rest: &[&'a [u8]]) -> Result<Options<'a>, String> {
        let (command, listed) = (self.name, self.listed);
        let mut options = Options::default();
        while let [option, tail @ ..] = rest {
            let Some(opt) = Opt::ALL.into_iter().find(|o| option.eq_ignore_ascii_case(o.name().as_bytes())) else {
                return Err(format!("ERR unknown option {} for {command}; options: {listed}", shown(option)));
            };
            let name = opt.name();
            if !self.takes.contains(&opt) {
                return Err(format!("ERR {command} takes no {name} ({}); options: {listed}", self.refuses_because));
            }
            let [value, tail @ ..] = tail else {
                return Err(format!("ERR {name} needs a value: {command} ... {name} {}", opt.placeholder()));
            };
            let given = if opt == Opt::Tz { options.tz.is_some() } else { options.get(opt).is_some() };
            if given {
                return Err(format!("ERR {name} given twice to {command}"));
            }
            if opt == Opt::Tz {
                options.tz = Some(zone(value)?);
            } else {
                options.numbers[opt as usize] = Some(integer_arg(value, name, opt.min())?);
            }
            rest = tail;
        }
        Ok(options)
    }
}

/// A `TZ` value: UTF-8 text of at most [`MAX_ZONE_BYTES`] (whether the zone exists is the
/// limit's to say).
fn zone(value: &[u8]) -> Result<&str, String> {
    match std::str::from_utf8(value) {
        Ok(zone) if zone.len() <= MAX_ZONE_BYTES => Ok(zone),
        _ => {
            Err(format!("ERR TZ must be an IANA time zone name (at most {MAX_ZONE_BYTES} bytes), got {}", shown(value)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options_by_name_and_names_what_it_refuses() {
        let (positional, rest) = CHECK.split(&[b"k", b"gcra", b"1", b"2", b"cost", b"3", b"Burst", b"4"]).unwrap();
        assert_eq!((positional.len(), rest.len()), (4, 4));
        let options = CHECK.options(rest).unwrap();
        assert_eq!(
            (options.get(Opt::Cost), options.get(Opt::Burst), options.get(Opt::Slices)),
            (Some(3), Some(4), None)
        );
        assert_eq!(RESET.split(&[b"k"]).unwrap_err(), RESET.usage);
        let error = |syntax: &Syntax, rest: &[&[u8]]| syntax.options(rest).unwrap_err();
        assert_eq!(error(&LIMIT, &[b"COST", b"-1"]), "ERR COST must be >= 0, got -1");
        assert_eq!(error(&LIMIT, &[b"COST", b"x"]), "ERR COST must be an integer, got x");
        assert_eq!(
            error(&LIMIT, &[b"COST", b"99999999999999999999"]),
            "ERR COST must be at most 9223372036854775807, got 99999999999999999999"
        );
        assert_eq!(error(&PEEK, &[b"SLICES"]), "ERR SLICES needs a value: TG.PEEK ... SLICES <s>");
        let long = [b'x'; 100];
        assert!(error(&CHECK, &[&long]).starts_with(&format!("ERR unknown option {} for", "x".repeat(64))));
    }
}
