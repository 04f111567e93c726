//! The reservations' metrics (reserve → settle, see `crate::reserve`):
//!
//! - `tollgate_reservations_total{event}`: `opened` (admitted, an id answered), `denied` (a limit
//!   refused the estimate: nothing charged), `settled`, and the settles refused:
//!   `settled_already`, `expired`, `unknown` (or malformed);
//! - `tollgate_reservation_settles_total{estimate}`: settled reservations by how the estimate
//!   compared with the actual: `over` (actual below it: the difference refunded), `under` (actual
//!   above it: the difference charged past the limit), `exact`;
//! - `tollgate_reservations_open`: the reservations this engine opened that no settle through it
//!   reached and whose deadline has not passed (updated on each reserve and settle), and
//!   `tollgate_reservations_expired_total`: those whose deadline passed so, as this engine sees
//!   them (a reservation settled by another node of a fleet counts here as expired on the node
//!   that opened it: the fleet's `settled` is the sum over nodes).
//!
//! The event and estimate labels are fixed words: never a client's value.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use std::sync::Arc;
use tollgate_core::Clock;

use crate::reserve::Opened;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EstimateLabels {
    estimate: &'static str,
}

/// What happened to a reservation, or to a settle of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Admitted: an id answered.
    Opened,
    /// A limit refused the estimate.
    Denied,
    /// Settled.
    Settled,
    /// A settle of a reservation settled already.
    SettledAlready,
    /// A settle after the deadline.
    Expired,
    /// A settle of an id no store knows (or not an id).
    Unknown,
}

impl Event {
    fn label(self) -> &'static str {
        match self {
            Event::Opened => "opened",
            Event::Denied => "denied",
            Event::Settled => "settled",
            Event::SettledAlready => "settled_already",
            Event::Expired => "expired",
            Event::Unknown => "unknown",
        }
    }
}

/// The reservations' counters and gauge.
#[derive(Debug)]
pub(crate) struct ReservationMetrics {
    events: Family<EventLabels, Counter>,
    settles: Family<EstimateLabels, Counter>,
}

/// `tollgate_reservations_open` and `tollgate_reservations_expired_total`, read from the
/// engine's followed reservations when the metrics are encoded: the reservations past their
/// deadline are swept then, so a scrape is up to date with no reserve or settle since.
#[derive(Debug)]
pub(crate) struct OpenCollector {
    pub(crate) opened: Arc<Opened>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl Collector for OpenCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (open, expired) = self.opened.at(self.clock.now_ns());
        let gauge = ConstGauge::new(i64::try_from(open).unwrap_or(i64::MAX));
        gauge.encode(encoder.encode_descriptor(
            "reservations_open",
            "Reservations this engine opened, not settled through it, before their deadline",
            None,
            gauge.metric_type(),
        )?)?;
        let counter = ConstCounter::new(expired);
        counter.encode(encoder.encode_descriptor(
            "reservations_expired",
            "Reservations this engine opened whose deadline passed with no settle through it (charged at the estimate)",
            None,
            counter.metric_type(),
        )?)
    }
}

impl ReservationMetrics {
    /// The metrics, registered in `registry`: a labelled series appears with its first event (as
    /// the decisions' do); the gauge and the expired counter are [`OpenCollector`]'s.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let events = Family::<EventLabels, Counter>::default();
        registry.register("reservations", "Reservations and their settles, by event", events.clone());
        let settles = Family::<EstimateLabels, Counter>::default();
        registry.register(
            "reservation_settles",
            "Settled reservations by how the estimate compared with the actual (over: refunded, under: charged past the limit)",
            settles.clone(),
        );
        ReservationMetrics { events, settles }
    }

    pub(crate) fn event(&self, event: Event) {
        self.events.get_or_create(&EventLabels { event: event.label() }).inc();
    }

    /// A settle of `actual` for an estimate of `estimate`.
    pub(crate) fn settled(&self, estimate: u64, actual: u64) {
        self.event(Event::Settled);
        let label = match actual.cmp(&estimate) {
            std::cmp::Ordering::Less => "over",
            std::cmp::Ordering::Greater => "under",
            std::cmp::Ordering::Equal => "exact",
        };
        self.settles.get_or_create(&EstimateLabels { estimate: label }).inc();
    }
}
