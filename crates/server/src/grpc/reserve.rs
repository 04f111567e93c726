//! Reservations over Envoy's rate-limit service: Envoy's request-time call reserves, its
//! response-time call (`apply_on_stream_done`) settles, each a plain `ShouldRateLimit` marked by a
//! descriptor of its own (see `docs/envoy.md` for the Envoy configuration):
//!
//! - **Reserve**: a request with one descriptor `[("tollgate_reserve", TTL_MS)]` reserves its
//!   other descriptors, all or nothing, each at its own `hits_addend`, else the request's (0
//!   means 1, as everywhere in this API): the estimate, the same for all (`INVALID_ARGUMENT`
//!   otherwise, as for a descriptor's `hits_addend` of 0). The answer is Envoy's usual one (the
//!   marker's status OK), with the dynamic metadata `tollgate_reservation` (the id) and
//!   `tollgate_deadline_ms` when admitted; Envoy keeps it under the namespace
//!   `envoy.filters.http.ratelimit`, where the response-time call's descriptor reads the id.
//! - **Settle**: a request whose descriptors are all `[("tollgate_settle", ID)]` settles each
//!   with its own `hits_addend` (a descriptor's, which may be 0), else the request's, taken as is:
//!   the *actual* amount, not a difference, so an actual below the estimate (a refund) is
//!   expressed as plainly as one above it. OK once; a refusal is a gRPC error: `FAILED_PRECONDITION`
//!   (settled already, or past the deadline: it stays charged at the estimate), `NOT_FOUND` (no
//!   such reservation), `INVALID_ARGUMENT` (not an id). Envoy ignores the answer of a call made at
//!   stream's end; a settle that failed (`UNAVAILABLE`) may be sent again: it applies once.

use std::time::Duration;

use tollgate_engine::{Descriptor, Engine, EngineError, RESERVE_ENTRY, SETTLE_ENTRY};
use tollgate_rls::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use tollgate_rls::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_store::{Refusal, StoreError};
use tonic::Status;

use crate::backend::Backend;

/// The longest reservation: an hour (see `tollgate_store::reservation`).
const MAX_TTL_MS: u64 = 3_600_000;

/// The answer to `request` if it reserves or settles (see the module docs); `None` for any
/// other request.
pub(super) async fn answer(
    engine: &Engine<std::sync::Arc<Backend>>,
    request: &RateLimitRequest,
    descriptors: &[Descriptor<'_>],
) -> Result<Option<RateLimitResponse>, Status> {
    let marked = |d: &Descriptor<'_>, entry: &str| d.entries.first().is_some_and(|(k, _)| *k == entry);
    if descriptors.iter().any(|d| marked(d, SETTLE_ENTRY)) {
        return settle(engine, request, descriptors).await.map(Some);
    }
    let reserves: Vec<usize> = (0..descriptors.len()).filter(|&i| marked(&descriptors[i], RESERVE_ENTRY)).collect();
    let &[marker] = reserves.as_slice() else {
        if reserves.is_empty() {
            return Ok(None);
        }
        return Err(Status::invalid_argument(format!("more than one {RESERVE_ENTRY} descriptor in one request")));
    };
    let ttl_ms = match descriptors[marker].entries.as_slice() {
        [(_, value)] => value.parse::<u64>().ok().filter(|ms| (1..=MAX_TTL_MS).contains(ms)),
        _ => None,
    };
    let ttl_ms = ttl_ms.ok_or_else(|| {
        Status::invalid_argument(format!(
            "a {RESERVE_ENTRY} descriptor is one entry, its value the reservation's life in ms (1 to {MAX_TTL_MS})"
        ))
    })?;
    let reserved: Vec<Descriptor<'_>> =
        descriptors.iter().enumerate().filter(|&(i, _)| i != marker).map(|(_, d)| d.clone()).collect();
    if reserved.is_empty() {
        return Err(Status::invalid_argument(format!(
            "a {RESERVE_ENTRY} request reserves its other descriptors: it has none"
        )));
    }
    let estimate = if request.hits_addend == 0 { 1 } else { u64::from(request.hits_addend) };
    let (verdicts, reservation) = engine
        .reserve_descriptors(&request.domain, &reserved, estimate, Duration::from_millis(ttl_ms))
        .await
        .map_err(status_of)?;
    let mut response = super::response(verdicts);
    let ok = DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() };
    response.statuses.insert(marker, ok);
    if let Some(reservation) = reservation {
        use prost_types::value::Kind;
        let value = |kind| prost_types::Value { kind: Some(kind) };
        let mut fields = std::collections::BTreeMap::new();
        fields.insert("tollgate_reservation".to_owned(), value(Kind::StringValue(reservation.id)));
        // Milliseconds since the epoch: exact in a protobuf number (a double).
        let deadline_ms = reservation.deadline_ns / 1_000_000;
        fields.insert("tollgate_deadline_ms".to_owned(), value(Kind::NumberValue(deadline_ms as f64)));
        response.dynamic_metadata = Some(prost_types::Struct { fields });
    }
    Ok(Some(response))
}

/// Settles each descriptor of `request` (all `tollgate_settle` ones).
async fn settle(
    engine: &Engine<std::sync::Arc<Backend>>,
    request: &RateLimitRequest,
    descriptors: &[Descriptor<'_>],
) -> Result<RateLimitResponse, Status> {
    let mut statuses = Vec::with_capacity(descriptors.len());
    for descriptor in descriptors {
        let &[(SETTLE_ENTRY, id)] = descriptor.entries.as_slice() else {
            return Err(Status::invalid_argument(format!(
                "a request that settles has only {SETTLE_ENTRY} descriptors, each one entry (the reservation's id)"
            )));
        };
        let actual = descriptor.hits_addend.unwrap_or(u64::from(request.hits_addend));
        engine.settle_descriptor(id, actual).await.map_err(status_of)?;
        statuses.push(DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() });
    }
    Ok(RateLimitResponse { overall_code: Code::Ok.into(), statuses, ..RateLimitResponse::default() })
}

/// An engine error as a gRPC status.
fn status_of(e: EngineError) -> Status {
    match e {
        EngineError::Store(StoreError::Refused(refusal)) => match refusal {
            Refusal::AlreadySettled(_) | Refusal::Expired(_) => Status::failed_precondition(refusal.to_string()),
            Refusal::Unknown(_) => Status::not_found(refusal.to_string()),
            Refusal::Full(_) => Status::resource_exhausted(refusal.to_string()),
            Refusal::Malformed(_) | Refusal::TooLarge(_) => Status::invalid_argument(refusal.to_string()),
        },
        EngineError::Store(e) if e.is_backend() => Status::unavailable(e.to_string()),
        EngineError::Store(e) => Status::invalid_argument(e.to_string()),
        e => Status::internal(e.to_string()),
    }
}
