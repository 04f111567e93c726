//! The calendar boundary function across DST changes, 29 February, months of every length, year
//! ends and a midnight that does not exist; and its invariants for any instant and zone.

use proptest::prelude::*;

use super::*;

const HOUR: u64 = 3_600 * 1_000_000_000;
const DAY: u64 = 24 * HOUR;

/// An RFC 3339 instant in ns since the epoch.
fn at(text: &str) -> u64 {
    u64::try_from(text.parse::<Timestamp>().unwrap().as_nanosecond()).unwrap()
}

fn window(unit: CalendarUnit, zone: &str, now: &str) -> (u64, u64) {
    Calendar::new(unit, Some(zone)).unwrap().window_at(at(now))
}

#[test]
fn a_day_across_dst_changes_lasts_23_or_25_hours() {
    use CalendarUnit::Day;
    // Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST -> 02:00 CET.
    assert_eq!(
        window(Day, "Europe/Berlin", "2026-03-29T12:00:00+02:00"),
        (at("2026-03-29T00:00:00+01:00"), at("2026-03-30T00:00:00+02:00"))
    );
    let (start, end) = window(Day, "Europe/Berlin", "2026-03-29T01:59:59.999999999+01:00");
    assert_eq!(end - start, 23 * HOUR);
    let (start, end) = window(Day, "Europe/Berlin", "2026-10-25T02:30:00+01:00");
    assert_eq!((start, end - start), (at("2026-10-25T00:00:00+02:00"), 25 * HOUR));
    // America/New_York: 2026-03-08 and 2026-11-01.
    let (start, end) = window(Day, "America/New_York", "2026-03-08T23:59:59-04:00");
    assert_eq!((start, end - start), (at("2026-03-08T00:00:00-05:00"), 23 * HOUR));
    let (start, end) = window(Day, "America/New_York", "2026-11-01T01:30:00-05:00");
    assert_eq!((start, end - start), (at("2026-11-01T00:00:00-04:00"), 25 * HOUR));
    // The same instant in UTC is in another day than in New York.
    assert_eq!(window(Day, "UTC", "2026-11-01T01:30:00-05:00").0, at("2026-11-01T00:00:00Z"));
}

#[test]
fn a_missing_midnight_starts_the_day_at_its_first_instant() {
    // America/Sao_Paulo, 2018-11-04: 00:00 -03 became 01:00 -02 (the same instant, 03:00Z).
    let (start, end) = window(CalendarUnit::Day, "America/Sao_Paulo", "2018-11-04T12:00:00-02:00");
    assert_eq!((start, end - start), (at("2018-11-04T03:00:00Z"), 23 * HOUR));
    let before = window(CalendarUnit::Day, "America/Sao_Paulo", "2018-11-03T23:59:59-03:00");
    assert_eq!(before, (at("2018-11-03T00:00:00-03:00"), start));
}

#[test]
fn months_last_28_to_31_days_and_a_berlin_month_starts_at_its_midnight() {
    use CalendarUnit::Month;
    for (now, days) in [
        ("2026-02-14T00:00:00Z", 28),
        ("2028-02-29T23:59:59Z", 29),
        ("2026-04-30T23:59:59Z", 30),
        ("2026-01-31T00:00:00Z", 31),
        ("2026-12-31T23:59:59.999999999Z", 31),
    ] {
        let (start, end) = window(Month, "UTC", now);
        assert_eq!(end - start, days * DAY, "{now}");
    }
    // Berlin's March 2026 holds the spring change: 31 days less an hour, from 23:00Z on 28 Feb.
    let (start, end) = window(Month, "Europe/Berlin", "2026-03-15T12:00:00Z");
    assert_eq!((start, end), (at("2026-02-28T23:00:00Z"), at("2026-03-31T22:00:00Z")));
    assert_eq!(end - start, 31 * DAY - HOUR);
    // 23:30Z on 28 February is already March in Berlin.
    assert_eq!(window(Month, "Europe/Berlin", "2026-02-28T23:30:00Z").0, start);
    assert_eq!(window(Month, "UTC", "2026-02-28T23:30:00Z").1, at("2026-03-01T00:00:00Z"));
}

#[test]
fn twenty_ninth_february_and_year_ends() {
    let (start, end) = window(CalendarUnit::Day, "UTC", "2028-02-29T08:00:00Z");
    assert_eq!((start, end), (at("2028-02-29T00:00:00Z"), at("2028-03-01T00:00:00Z")));
    let (start, end) = window(CalendarUnit::Year, "UTC", "2028-02-29T08:00:00Z");
    assert_eq!((start, end - start), (at("2028-01-01T00:00:00Z"), 366 * DAY));
    let (start, end) = window(CalendarUnit::Year, "UTC", "2027-12-31T23:59:59.999999999Z");
    assert_eq!((start, end), (at("2027-01-01T00:00:00Z"), at("2028-01-01T00:00:00Z")));
    let (start, end) = window(CalendarUnit::Year, "America/New_York", "2027-01-01T03:00:00Z");
    assert_eq!((start, end), (at("2026-01-01T00:00:00-05:00"), at("2027-01-01T00:00:00-05:00")));
}

#[test]
fn weeks_start_on_monday() {
    // Friday 2026-11-27: the week of Monday 23 November.
    let (start, end) = window(CalendarUnit::Week, "Europe/Berlin", "2026-11-27T10:00:00+01:00");
    assert_eq!((start, end), (at("2026-11-23T00:00:00+01:00"), at("2026-11-30T00:00:00+01:00")));
    // The week of the autumn change lasts an hour longer.
    let (start, end) = window(CalendarUnit::Week, "Europe/Berlin", "2026-10-25T12:00:00+01:00");
    assert_eq!((start, end - start), (at("2026-10-19T00:00:00+02:00"), 7 * DAY + HOUR));
}

#[test]
fn an_unknown_zone_is_refused_naming_it() {
    let err = Calendar::new(CalendarUnit::Month, Some("Europe/Berlln")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown time zone \"Europe/Berlln\": use an IANA name such as UTC, Europe/Berlin or America/New_York"
    );
    assert!(Calendar::new(CalendarUnit::Month, Some("")).is_err());
    assert!(Calendar::new(CalendarUnit::Month, Some(&"A/".repeat(100))).is_err());
    assert_eq!(Calendar::new(CalendarUnit::Day, None).unwrap().zone(), "UTC");
}

const ZONES: [&str; 6] =
    ["UTC", "Europe/Berlin", "America/New_York", "America/Sao_Paulo", "Australia/Lord_Howe", "Pacific/Apia"];

proptest! {
    /// For any instant (1970 to 2500) and zone: the window holds it, is the window of each of its
    /// instants, is followed by the window starting at its end, and is no longer than the bound.
    #[test]
    fn windows_tile_time(now in 0u64..16_725_225_600_000_000_000, zone in 0usize..6, unit in 0usize..4) {
        let unit = CalendarUnit::ALL[unit];
        let calendar = Calendar::new(unit, Some(ZONES[zone])).unwrap();
        let (start, end) = calendar.window_at(now);
        prop_assert!(start <= now && now < end);
        prop_assert!(end - start <= unit.longest_ns());
        prop_assert_eq!(calendar.window_at(start), (start, end));
        prop_assert_eq!(calendar.window_at(end - 1), (start, end));
        prop_assert_eq!(calendar.window_at(end).0, end);
        if start > 0 {
            prop_assert_eq!(calendar.window_at(start - 1).1, start);
        }
    }
}
