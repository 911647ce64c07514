//! What `kubectl drain-status` shows, computed from what it read: each StatefulSet's drain-status
//! annotation, the claims and drain pods of its namespace, and the time. Pure: no client, no clock.
//!
//! The annotation is read leniently, as JSON values rather than the controller's types: an
//! unknown state is shown as it is, a missing field as `-`, and text that is not a status at all
//! as one row with the state [`UNREADABLE`].

use std::collections::{BTreeMap, BTreeSet};

use drain_api::names::{claim_name, parse_ordinal, pod_name};
use drain_api::progress::DrainProgress;
use jiff::Timestamp;
use serde_json::{Map, Value};

/// The state shown for a status (or an ordinal's entry) that is not the JSON the controller
/// writes.
pub const UNREADABLE: &str = "unreadable status";

/// What an empty cell shows.
const NONE: &str = "-";

/// One StatefulSet that carries the drain-status annotation, with what its rows need from its
/// namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetSnapshot {
    /// The set's namespace.
    pub namespace: String,
    /// The set's name.
    pub name: String,
    /// The text of the drain-status annotation.
    pub status: String,
    /// The names of the set's `volumeClaimTemplates`, in order.
    pub claim_templates: Vec<String>,
    /// The names of the PersistentVolumeClaims in the set's namespace.
    pub claims: BTreeSet<String>,
    /// The creation time of each pod in the set's namespace that carries the drain-pod label,
    /// by pod name.
    pub drain_pods: BTreeMap<String, Timestamp>,
}

/// One line of the table: one ordinal of one set, each cell as shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The set's namespace (a column only with `--all-namespaces`).
    pub namespace: String,
    /// The set's name.
    pub set: String,
    /// The ordinal, as the status writes it.
    pub ordinal: String,
    /// `waiting`, `draining`, `stuck`, `retrying`, `failed`, `blocked`, `done`, another state as
    /// written, or [`UNREADABLE`].
    pub state: String,
    /// The attempt running (`2`), or how many failed (`3 failed`).
    pub attempt: String,
    /// Age of the drain pod (draining, stuck) or time since the drain succeeded (done).
    pub age: String,
    /// The drain's published progress, as `120/1000 rec, 11.7 MiB/97.7 MiB`.
    pub progress: String,
    /// Why the last attempt failed (for a stuck drain pod: why it is stuck).
    pub last_failure: String,
    /// The ordinal's claims that exist, comma-separated.
    pub claims: String,
}

/// Everything to print: the table's rows and the lines that follow it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// One row per ordinal, by namespace, set and ordinal.
    pub rows: Vec<Row>,
    /// `SET: problem: …` and `SET: ordinal N: error: …` lines, and the reason of each `blocked`
    /// or `failed` ordinal (the states that wait for a person); `NAMESPACE/SET` with
    /// `--all-namespaces`.
    pub notes: Vec<String>,
}

/// The report of `sets` at `now`; `all_namespaces` names sets with their namespace in notes.
pub fn report(sets: &[SetSnapshot], all_namespaces: bool, now: Timestamp) -> Report {
    let mut sorted: Vec<&SetSnapshot> = sets.iter().collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut report = Report::default();
    for set in sorted {
        let label = if all_namespaces {
            format!("{}/{}", set.namespace, set.name)
        } else {
            set.name.clone()
        };
        set_report(set, &label, now, &mut report);
    }
    report
}

/// Adds the rows and notes of one set.
fn set_report(set: &SetSnapshot, label: &str, now: Timestamp, report: &mut Report) {
    let status = match serde_json::from_str::<Value>(&set.status) {
        Ok(Value::Object(status)) => status,
        _ => {
            report.rows.push(unreadable_row(set, NONE));
            return;
        }
    };
    let empty = Map::new();
    let ordinals = match status.get("ordinals") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(ordinals)) => ordinals,
        Some(_) => {
            report.rows.push(unreadable_row(set, NONE));
            return;
        }
    };

    for (key, entry) in by_ordinal(ordinals) {
        report.rows.push(row(set, key, entry, now));
    }

    match status.get("problem") {
        None | Some(Value::Null) => {}
        Some(problem) => report
            .notes
            .push(format!("{label}: problem: {}", text(problem))),
    }
    match status.get("errors") {
        None | Some(Value::Null) => {}
        Some(Value::Object(errors)) => {
            for (key, error) in by_ordinal(errors) {
                report.notes.push(format!(
                    "{label}: ordinal {}: error: {}",
                    clean(key),
                    text(error)
                ));
            }
        }
        Some(errors) => report
            .notes
            .push(format!("{label}: errors: {}", text(errors))),
    }
    for (key, entry) in by_ordinal(ordinals) {
        let Some(state) = entry.get("state").and_then(Value::as_str) else {
            continue;
        };
        if let ("blocked" | "failed", Some(reason)) = (state, entry.get("reason")) {
            report.notes.push(format!(
                "{label}: ordinal {}: {state}: {}",
                clean(key),
                text(reason)
            ));
        }
        if let ("awaitingApproval", Some(Value::Array(claims))) = (state, entry.get("claims")) {
            let claims: Vec<String> = claims.iter().map(text).collect();
            report.notes.push(format!(
                "{label}: ordinal {}: drained; approve deleting its claims with: kubectl annotate pvc {} {}=true",
                clean(key),
                claims.join(" "),
                drain_api::claim_annotations::APPROVED
            ));
        }
    }
}

/// The entries of a JSON object keyed by ordinal, lowest ordinal first, then other keys.
fn by_ordinal(map: &Map<String, Value>) -> Vec<(&str, &Value)> {
    let mut entries: Vec<(&str, &Value)> = map.iter().map(|(k, v)| (k.as_str(), v)).collect();
    entries.sort_by_key(|(key, _)| (parse_ordinal(key).is_none(), parse_ordinal(key), *key));
    entries
}

/// The row of a set whose status (or one of whose ordinal entries) cannot be read.
fn unreadable_row(set: &SetSnapshot, ordinal: &str) -> Row {
    Row {
        namespace: set.namespace.clone(),
        set: set.name.clone(),
        ordinal: clean(ordinal),
        state: UNREADABLE.to_owned(),
        attempt: NONE.to_owned(),
        age: NONE.to_owned(),
        progress: NONE.to_owned(),
        last_failure: NONE.to_owned(),
        claims: NONE.to_owned(),
    }
}

/// The row of the ordinal `key` with the status `entry`.
fn row(set: &SetSnapshot, key: &str, entry: &Value, now: Timestamp) -> Row {
    let Value::Object(fields) = entry else {
        return unreadable_row(set, key);
    };
    let field = |name: &str| fields.get(name).filter(|v| !v.is_null());
    let ordinal = parse_ordinal(key);
    let state = field("state").map_or_else(|| NONE.to_owned(), text);

    let attempt = match (field("attempt"), field("attempts")) {
        (Some(attempt), _) => text(attempt),
        (None, Some(failed)) => format!("{} failed", text(failed)),
        (None, None) => NONE.to_owned(),
    };

    let since = match state.as_str() {
        "draining" | "stuck" => {
            ordinal.and_then(|o| set.drain_pods.get(&pod_name(&set.name, o)).copied())
        }
        "done" => field("at")
            .and_then(Value::as_str)
            .and_then(|at| at.parse::<Timestamp>().ok()),
        "awaitingApproval" => field("since")
            .and_then(Value::as_str)
            .and_then(|at| at.parse::<Timestamp>().ok()),
        _ => None,
    };
    let age = since.map_or_else(|| NONE.to_owned(), |t| format_age(now, t));

    let progress = match field("progress") {
        None => NONE.to_owned(),
        Some(p) => serde_json::from_value::<DrainProgress>(p.clone())
            .map_or_else(|_| "unreadable".to_owned(), |p| format_progress(&p)),
    };

    let last_failure = field("lastFailure")
        .or_else(|| field("reason").filter(|_| state == "stuck"))
        .map_or_else(|| NONE.to_owned(), text);

    let claims: Vec<String> = ordinal
        .map(|o| {
            set.claim_templates
                .iter()
                .map(|t| claim_name(t, &set.name, o))
                .filter(|c| set.claims.contains(c))
                .collect()
        })
        .unwrap_or_default();
    let claims = if claims.is_empty() {
        NONE.to_owned()
    } else {
        claims.join(",")
    };

    Row {
        namespace: set.namespace.clone(),
        set: set.name.clone(),
        ordinal: clean(key),
        state,
        attempt,
        age,
        progress,
        last_failure,
        claims,
    }
}

/// A JSON value as a cell: a string as it is, anything else as compact JSON; control characters
/// (newlines, tabs) become spaces so they cannot break the table.
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => clean(s),
        other => clean(&other.to_string()),
    }
}

/// `s` with each control character replaced by a space.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Progress as `moved/total rec, moved/total bytes`: `120/1000 rec, 11.7 MiB/97.7 MiB`.
pub fn format_progress(p: &DrainProgress) -> String {
    let records = p.records_moved.saturating_add(p.records_remaining);
    let bytes = p.bytes_moved.saturating_add(p.bytes_remaining);
    format!(
        "{}/{records} rec, {}/{}",
        p.records_moved,
        format_bytes(p.bytes_moved),
        format_bytes(bytes)
    )
}

/// A byte count in binary units with one decimal: `512 B`, `1.5 KiB`, `97.7 MiB`.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = "B";
    for next in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

/// The time from `then` to `now` as kubectl shows ages.
pub fn format_age(now: Timestamp, then: Timestamp) -> String {
    human_duration(now.duration_since(then).as_secs())
}

/// A duration in whole seconds as kubectl shows it (apimachinery's `HumanDuration`): `45s`,
/// `3m20s`, `15m`, `2h30m`, `20h`, `3d4h`, `30d`, `2y10d`, `9y`; up to a second in the future
/// is `0s` (clock skew), further is `<invalid>`.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return with_rest(minutes, "m", seconds % 60, "s");
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return with_rest(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return with_rest(days, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return with_rest(years, "y", days % 365, "d");
    }
    format!("{years}y")
}

/// `3m20s`, or `3m` when the rest is 0.
fn with_rest(value: i64, unit: &str, rest: i64, rest_unit: &str) -> String {
    if rest == 0 {
        format!("{value}{unit}")
    } else {
        format!("{value}{unit}{rest}{rest_unit}")
    }
}

/// The rows as a table in kubectl's style: a header line, columns left-aligned and three spaces
/// apart, no trailing spaces; the NAMESPACE column only if `all_namespaces`. Empty for no rows.
pub fn render_table(rows: &[Row], all_namespaces: bool) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut header = vec![
        "SET",
        "ORDINAL",
        "STATE",
        "ATTEMPT",
        "AGE",
        "PROGRESS",
        "LAST FAILURE",
        "CLAIMS",
    ];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    let mut lines: Vec<Vec<&str>> = vec![header];
    for row in rows {
        let mut cells = vec![
            row.set.as_str(),
            row.ordinal.as_str(),
            row.state.as_str(),
            row.attempt.as_str(),
            row.age.as_str(),
            row.progress.as_str(),
            row.last_failure.as_str(),
            row.claims.as_str(),
        ];
        if all_namespaces {
            cells.insert(0, row.namespace.as_str());
        }
        lines.push(cells);
    }
    render_columns(&lines)
}

/// Lines of cells (the first the header) in kubectl's style: columns left-aligned and three
/// spaces apart, no trailing spaces.
pub fn render_columns<S: AsRef<str>>(lines: &[Vec<S>]) -> String {
    let Some(first) = lines.first() else {
        return String::new();
    };
    let columns = first.len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].as_ref().chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in lines {
        let mut text = String::new();
        for (c, cell) in line.iter().enumerate() {
            let cell = cell.as_ref();
            text.push_str(cell);
            if c + 1 < columns {
                let pad = widths[c] - cell.chars().count() + 3;
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const NOW: &str = "2026-11-23T10:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// A set `web` in `ns` with the claim template `data`, no claims and no drain pods.
    fn set(status: &str) -> SetSnapshot {
        SetSnapshot {
            namespace: "ns".into(),
            name: "web".into(),
            status: status.into(),
            claim_templates: vec!["data".into()],
            ..SetSnapshot::default()
        }
    }

    fn with_claims(mut s: SetSnapshot, claims: &[&str]) -> SetSnapshot {
        s.claims = claims.iter().map(|c| (*c).to_owned()).collect();
        s
    }

    fn with_pod(mut s: SetSnapshot, name: &str, created: &str) -> SetSnapshot {
        s.drain_pods.insert(name.into(), ts(created));
        s
    }

    fn rows(s: SetSnapshot) -> Vec<Row> {
        report(&[s], false, now()).rows
    }

    fn one_row(s: SetSnapshot) -> Row {
        let rows = rows(s);
        assert_eq!(rows.len(), 1, "{rows:#?}");
        rows.into_iter().next().unwrap()
    }

    /// (state, attempt, age, progress, last failure, claims) of a row.
    fn cells(r: &Row) -> [&str; 6] {
        [
            &r.state,
            &r.attempt,
            &r.age,
            &r.progress,
            &r.last_failure,
            &r.claims,
        ]
    }

    const PROGRESS: &str = r#"{"recordsMoved":120,"recordsRemaining":880,"bytesMoved":12288000,"bytesRemaining":90112000,"changedAt":"2026-11-23T09:59:55Z"}"#;

    #[test]
    fn draining_shows_attempt_pod_age_progress_and_claims() {
        let s = set(&format!(
            r#"{{"ordinals":{{"2":{{"state":"draining","attempt":1,"progress":{PROGRESS}}}}}}}"#
        ));
        let s = with_claims(s, &["data-web-2", "data-web-1", "other-web-2"]);
        let s = with_pod(s, "web-2", "2026-11-23T09:57:00Z");
        let r = one_row(s);
        assert_eq!(
            (r.namespace.as_str(), r.set.as_str(), r.ordinal.as_str()),
            ("ns", "web", "2")
        );
        assert_eq!(
            cells(&r),
            [
                "draining",
                "1",
                "3m",
                "120/1000 rec, 11.7 MiB/97.7 MiB",
                "-",
                "data-web-2"
            ]
        );
    }

    #[test]
    fn draining_without_progress_or_pod_shows_dashes() {
        let r = one_row(set(
            r#"{"ordinals":{"2":{"state":"draining","attempt":2}}}"#,
        ));
        assert_eq!(cells(&r), ["draining", "2", "-", "-", "-", "-"]);
    }

    #[test]
    fn stuck_shows_pod_age_and_reason_as_failure() {
        let s = set(
            r#"{"ordinals":{"5":{"state":"stuck","attempt":2,"reason":"image pull failed: ErrImagePull"}}}"#,
        );
        let s = with_pod(s, "web-5", "2026-11-23T09:59:15Z");
        let r = one_row(with_claims(s, &["data-web-5"]));
        assert_eq!(
            cells(&r),
            [
                "stuck",
                "2",
                "45s",
                "-",
                "image pull failed: ErrImagePull",
                "data-web-5"
            ]
        );
    }

    #[test]
    fn retrying_shows_failed_attempts_and_last_failure() {
        let s = set(
            r#"{"ordinals":{"1":{"state":"retrying","attempts":2,"retryAfter":"2026-11-23T10:00:20Z","lastFailure":"container drain exited with code 1"}}}"#,
        );
        // A leftover pod of that name does not give a retrying ordinal an age.
        let s = with_pod(s, "web-1", "2026-11-23T09:00:00Z");
        let r = one_row(with_claims(s, &["data-web-1"]));
        assert_eq!(
            cells(&r),
            [
                "retrying",
                "2 failed",
                "-",
                "-",
                "container drain exited with code 1",
                "data-web-1"
            ]
        );
    }

    #[test]
    fn failed_shows_last_failure_and_notes_why_retrying_stopped() {
        let s = set(
            r#"{"ordinals":{"0":{"state":"failed","attempts":3,"lastFailure":"container drain exited with code 1","reason":"3 of 3 attempts failed"}}}"#,
        );
        let rep = report(&[with_claims(s, &["data-web-0"])], false, now());
        assert_eq!(
            cells(&rep.rows[0]),
            [
                "failed",
                "3 failed",
                "-",
                "-",
                "container drain exited with code 1",
                "data-web-0"
            ]
        );
        assert_eq!(
            rep.notes,
            ["web: ordinal 0: failed: 3 of 3 attempts failed"]
        );
    }

    #[test]
    fn awaiting_approval_shows_its_age_and_the_command_that_approves() {
        let s = set(
            r#"{"ordinals":{"3":{"state":"awaitingApproval","since":"2026-11-23T09:00:00Z","claims":["data-web-3"]}}}"#,
        );
        let r = report(&[s], false, NOW.parse().unwrap());
        assert_eq!(cells(&r.rows[0])[..3], ["awaitingApproval", "-", "60m"]);
        assert!(
            r.notes.iter().any(|n| n.contains(
                "kubectl annotate pvc data-web-3 statefulsets.kubernetes.io/drain-approved=true"
            )),
            "{:?}",
            r.notes
        );
    }

    #[test]
    fn done_shows_time_since_success() {
        let r = one_row(set(
            r#"{"ordinals":{"3":{"state":"done","at":"2026-11-23T06:30:00Z"}}}"#,
        ));
        assert_eq!(cells(&r), ["done", "-", "3h30m", "-", "-", "-"]);
    }

    #[test]
    fn done_with_a_bad_or_missing_time_has_no_age() {
        let rows = rows(set(
            r#"{"ordinals":{"3":{"state":"done","at":"yesterday"},"4":{"state":"done"}}}"#,
        ));
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.age == "-"), "{rows:#?}");
    }

    #[test]
    fn waiting_shows_no_reason_and_no_note() {
        let s = set(r#"{"ordinals":{"4":{"state":"waiting","reason":"pod web-4 still exists"}}}"#);
        let rep = report(&[with_claims(s, &["data-web-4"])], false, now());
        assert_eq!(
            cells(&rep.rows[0]),
            ["waiting", "-", "-", "-", "-", "data-web-4"]
        );
        assert!(rep.notes.is_empty());
    }

    #[test]
    fn blocked_is_explained_after_the_table() {
        let s = set(
            r#"{"ordinals":{"6":{"state":"blocked","reason":"pod web-6 is not a drain pod: delete it"}}}"#,
        );
        let rep = report(&[s], false, now());
        assert_eq!(cells(&rep.rows[0]), ["blocked", "-", "-", "-", "-", "-"]);
        assert_eq!(
            rep.notes,
            ["web: ordinal 6: blocked: pod web-6 is not a drain pod: delete it"]
        );
    }

    #[test]
    fn unknown_states_are_shown_as_written() {
        let s = set(r#"{"ordinals":{"7":{"state":"pausing","attempt":4,"extra":true}}}"#);
        let s = with_pod(s, "web-7", "2026-11-23T09:00:00Z");
        let r = one_row(s);
        assert_eq!(cells(&r), ["pausing", "4", "-", "-", "-", "-"]);
    }

    #[test]
    fn missing_and_odd_fields_are_dashes_or_shown_as_json() {
        let s = set(
            r#"{"ordinals":{"1":{},"2":{"state":null,"attempt":null,"attempts":null},"3":{"state":7,"attempt":"two","lastFailure":{"code":1}}}}"#,
        );
        let rows = rows(s);
        assert_eq!(cells(&rows[0]), ["-", "-", "-", "-", "-", "-"]);
        assert_eq!(cells(&rows[1]), ["-", "-", "-", "-", "-", "-"]);
        assert_eq!(
            cells(&rows[2]),
            ["7", "two", "-", "-", r#"{"code":1}"#, "-"]
        );
    }

    #[test]
    fn an_entry_that_is_not_an_object_is_unreadable() {
        let rows = rows(set(r#"{"ordinals":{"2":"draining","3":{"state":"done"}}}"#));
        assert_eq!(rows[0].ordinal, "2");
        assert_eq!(cells(&rows[0]), [UNREADABLE, "-", "-", "-", "-", "-"]);
        assert_eq!(rows[1].state, "done");
    }

    #[test]
    fn progress_that_is_not_the_format_is_unreadable() {
        let r = one_row(set(
            r#"{"ordinals":{"2":{"state":"draining","attempt":1,"progress":{"recordsMoved":"many"}}}}"#,
        ));
        assert_eq!(r.progress, "unreadable");
    }

    #[rstest]
    #[case("not json")]
    #[case("")]
    #[case("[1,2]")]
    #[case(r#""draining""#)]
    #[case("null")]
    #[case(r#"{"ordinals":[1,2]}"#)]
    #[case(r#"{"ordinals":"none"}"#)]
    fn bad_status_is_one_unreadable_row(#[case] status: &str) {
        let rep = report(&[set(status)], false, now());
        assert_eq!(
            rep.rows,
            [Row {
                namespace: "ns".into(),
                set: "web".into(),
                ordinal: "-".into(),
                state: UNREADABLE.into(),
                attempt: "-".into(),
                age: "-".into(),
                progress: "-".into(),
                last_failure: "-".into(),
                claims: "-".into(),
            }]
        );
        assert!(rep.notes.is_empty());
    }

    #[test]
    fn a_status_without_ordinals_has_no_rows() {
        for status in ["{}", r#"{"ordinals":{}}"#, r#"{"ordinals":null}"#] {
            assert_eq!(report(&[set(status)], false, now()), Report::default());
        }
    }

    #[test]
    fn every_state_of_the_documented_example() {
        let status = format!(
            r#"{{"ordinals":{{"2":{{"state":"draining","attempt":1,"progress":{PROGRESS}}},"1":{{"state":"retrying","attempts":2,"retryAfter":"2026-11-23T10:01:00Z","lastFailure":"container drain exited with code 1"}},"0":{{"state":"failed","attempts":3,"lastFailure":"container drain exited with code 1","reason":"3 of 3 attempts failed"}},"3":{{"state":"done","at":"2026-11-19T08:00:00Z"}},"4":{{"state":"waiting","reason":"waiting for a drain slot"}},"5":{{"state":"stuck","attempt":2,"reason":"unschedulable"}},"6":{{"state":"blocked","reason":"pod web-6 is not ours"}},"10":{{"state":"waiting","reason":"pod web-10 still exists"}}}},"problem":"invalid drain template: no containers","errors":{{"2":"failed to delete claim data-web-2: forbidden"}}}}"#
        );
        let s = with_claims(
            set(&status),
            &["data-web-0", "data-web-1", "data-web-2", "data-web-10"],
        );
        let s = with_pod(s, "web-2", "2026-11-23T09:59:00Z");
        let rep = report(&[s], false, now());
        let states: Vec<(&str, &str)> = rep
            .rows
            .iter()
            .map(|r| (r.ordinal.as_str(), r.state.as_str()))
            .collect();
        assert_eq!(
            states,
            [
                ("0", "failed"),
                ("1", "retrying"),
                ("2", "draining"),
                ("3", "done"),
                ("4", "waiting"),
                ("5", "stuck"),
                ("6", "blocked"),
                ("10", "waiting"),
            ]
        );
        assert_eq!(rep.rows[3].age, "4d2h");
        assert_eq!(rep.rows[5].last_failure, "unschedulable");
        assert_eq!(rep.rows[7].claims, "data-web-10");
        assert_eq!(
            rep.notes,
            [
                "web: problem: invalid drain template: no containers",
                "web: ordinal 2: error: failed to delete claim data-web-2: forbidden",
                "web: ordinal 0: failed: 3 of 3 attempts failed",
                "web: ordinal 6: blocked: pod web-6 is not ours",
            ]
        );
        let table = render_table(&rep.rows, false);
        assert_eq!(
            table,
            "\
SET   ORDINAL   STATE      ATTEMPT    AGE    PROGRESS                          LAST FAILURE                         CLAIMS
web   0         failed     3 failed   -      -                                 container drain exited with code 1   data-web-0
web   1         retrying   2 failed   -      -                                 container drain exited with code 1   data-web-1
web   2         draining   1          60s    120/1000 rec, 11.7 MiB/97.7 MiB   -                                    data-web-2
web   3         done       -          4d2h   -                                 -                                    -
web   4         waiting    -          -      -                                 -                                    -
web   5         stuck      2          -      -                                 unschedulable                        -
web   6         blocked    -          -      -                                 -                                    -
web   10        waiting    -          -      -                                 -                                    data-web-10
"
        );
    }

    #[test]
    fn a_problem_alone_is_a_note_without_rows() {
        let rep = report(&[set(r#"{"problem":"bad template"}"#)], false, now());
        assert!(rep.rows.is_empty());
        assert_eq!(rep.notes, ["web: problem: bad template"]);
    }

    #[test]
    fn errors_that_are_not_an_object_are_shown_as_json() {
        let rep = report(&[set(r#"{"errors":["boom"],"problem":7}"#)], false, now());
        assert_eq!(rep.notes, ["web: problem: 7", r#"web: errors: ["boom"]"#]);
    }

    #[test]
    fn every_claim_template_of_the_ordinal_in_template_order() {
        let mut s = set(r#"{"ordinals":{"2":{"state":"waiting"}}}"#);
        s.claim_templates = vec!["logs".into(), "data".into(), "cache".into()];
        let s = with_claims(
            s,
            &["data-web-2", "logs-web-2", "data-web-20", "data-webx-2"],
        );
        assert_eq!(one_row(s).claims, "logs-web-2,data-web-2");
    }

    #[test]
    fn an_ordinal_that_is_not_a_number_is_shown_but_has_no_claims_or_pod() {
        let s = set(r#"{"ordinals":{"x":{"state":"draining","attempt":1},"1":{"state":"done"}}}"#);
        let s = with_claims(s, &["data-web-x"]);
        let s = with_pod(s, "web-x", "2026-11-23T09:00:00Z");
        let rows = rows(s);
        assert_eq!(rows[0].ordinal, "1");
        assert_eq!(rows[1].ordinal, "x");
        assert_eq!(cells(&rows[1]), ["draining", "1", "-", "-", "-", "-"]);
    }

    #[test]
    fn control_characters_cannot_break_the_table() {
        let r = one_row(set(
            r#"{"ordinals":{"1":{"state":"retrying","attempts":1,"lastFailure":"line one\nline\ttwo"}}}"#,
        ));
        assert_eq!(r.last_failure, "line one line two");
    }

    #[test]
    fn all_namespaces_adds_the_column_and_names_sets_with_their_namespace() {
        let mut b = set(r#"{"ordinals":{"1":{"state":"waiting"}},"problem":"p"}"#);
        b.namespace = "beta".into();
        let mut a = set(r#"{"ordinals":{"0":{"state":"done"}}}"#);
        a.namespace = "alpha".into();
        a.name = "db".into();
        a.claims = ["data-db-0".to_owned()].into();
        let rep = report(&[b, a], true, now());
        assert_eq!(rep.notes, ["beta/web: problem: p"]);
        assert_eq!(
            render_table(&rep.rows, true),
            "\
NAMESPACE   SET   ORDINAL   STATE     ATTEMPT   AGE   PROGRESS   LAST FAILURE   CLAIMS
alpha       db    0         done      -         -     -          -              data-db-0
beta        web   1         waiting   -         -     -          -              -
"
        );
        assert!(!render_table(&rep.rows, false).contains("NAMESPACE"));
    }

    #[test]
    fn sets_are_sorted_by_namespace_then_name() {
        let mut sets = Vec::new();
        for (ns, name) in [("b", "a"), ("a", "z"), ("a", "b")] {
            let mut s = set(r#"{"ordinals":{"0":{"state":"waiting"}}}"#);
            s.namespace = ns.into();
            s.name = name.into();
            sets.push(s);
        }
        let order: Vec<(String, String)> = report(&sets, true, now())
            .rows
            .into_iter()
            .map(|r| (r.namespace, r.set))
            .collect();
        assert_eq!(
            order,
            [
                ("a".into(), "b".into()),
                ("a".into(), "z".into()),
                ("b".into(), "a".into())
            ]
        );
    }

    #[test]
    fn no_rows_render_as_nothing() {
        assert_eq!(render_table(&[], true), "");
    }

    #[test]
    fn wide_characters_count_as_one_column_each() {
        let r = one_row(set(
            r#"{"ordinals":{"1":{"state":"retrying","attempts":1,"lastFailure":"échec"}}}"#,
        ));
        let table = render_table(&[r], false);
        let lines: Vec<&str> = table.lines().collect();
        let header_claims = lines[0].find("CLAIMS").unwrap();
        let row_claims = lines[1].rfind('-').unwrap();
        assert_eq!(
            lines[0][..header_claims].chars().count(),
            lines[1][..row_claims].chars().count()
        );
    }

    #[rstest]
    #[case(0, 0, 0, 0, "0/0 rec, 0 B/0 B")]
    #[case(120, 880, 12_288_000, 90_112_000, "120/1000 rec, 11.7 MiB/97.7 MiB")]
    #[case(5, 0, 1023, 0, "5/5 rec, 1023 B/1023 B")]
    #[case(1, 1, 1024, 512, "1/2 rec, 1.0 KiB/1.5 KiB")]
    #[case(0, 7, 0, 3 << 30, "0/7 rec, 0 B/3.0 GiB")]
    #[case(
        u64::MAX,
        1,
        u64::MAX,
        1,
        "18446744073709551615/18446744073709551615 rec, 16.0 EiB/16.0 EiB"
    )]
    fn progress_formats(
        #[case] records_moved: u64,
        #[case] records_remaining: u64,
        #[case] bytes_moved: u64,
        #[case] bytes_remaining: u64,
        #[case] want: &str,
    ) {
        let p = DrainProgress {
            records_moved,
            records_remaining,
            bytes_moved,
            bytes_remaining,
            bytes_sent: bytes_moved,
            changed_at: NOW.into(),
        };
        assert_eq!(format_progress(&p), want);
    }

    #[rstest]
    #[case(-5, "<invalid>")]
    #[case(-2, "<invalid>")]
    #[case(-1, "0s")]
    #[case(0, "0s")]
    #[case(45, "45s")]
    #[case(119, "119s")]
    #[case(120, "2m")]
    #[case(200, "3m20s")]
    #[case(599, "9m59s")]
    #[case(600, "10m")]
    #[case(179 * 60 + 59, "179m")]
    #[case(3 * 3600, "3h")]
    #[case(2 * 3600 + 30 * 60, "150m")]
    #[case(7 * 3600 + 59 * 60, "7h59m")]
    #[case(8 * 3600, "8h")]
    #[case(47 * 3600, "47h")]
    #[case(48 * 3600, "2d")]
    #[case(4 * 86400 + 2 * 3600, "4d2h")]
    #[case(8 * 86400, "8d")]
    #[case(729 * 86400, "729d")]
    #[case(730 * 86400, "2y")]
    #[case(731 * 86400, "2y1d")]
    #[case(8 * 365 * 86400, "8y")]
    #[case(20 * 365 * 86400 + 86400, "20y")]
    fn durations_as_kubectl_shows_them(#[case] seconds: i64, #[case] want: &str) {
        assert_eq!(human_duration(seconds), want);
    }

    #[test]
    fn ages_truncate_to_whole_seconds_and_tolerate_a_second_of_skew() {
        assert_eq!(format_age(now(), ts("2026-11-23T09:59:14.9Z")), "45s");
        assert_eq!(format_age(now(), ts("2026-11-23T10:00:01Z")), "0s");
        assert_eq!(format_age(now(), ts("2026-11-23T10:00:05Z")), "<invalid>");
        assert_eq!(format_age(now(), ts("2026-11-21T10:00:00Z")), "2d");
    }
}
