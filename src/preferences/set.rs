//! A recipient's own preferences: opt-outs by category, by channel or by the pair,
//! and quiet hours (issue #38). Pure: the set as the HTTP API takes it (validated
//! whole, every refusal naming its field), the RFC 7386 merge `PATCH` applies, and
//! the hash fields `src/admission/lua/` reads at admission.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use quota_worker_producer::Priority;
use serde_json::{Map, Value};

use crate::quota::send_windows::{parse_days, parse_time, Opening, SendWindows};

/// The most a set's JSON may weigh (the API answers 413 beyond).
pub const MAX_BYTES: usize = 64 * 1024;

/// Why a set was refused: what is wrong, and the field (`quiet_hours.windows[0].from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// What is wrong.
    pub error: String,
    /// The path of the field.
    pub field: String,
}

fn invalid(field: impl Into<String>, error: impl Into<String>) -> Invalid {
    Invalid {
        error: error.into(),
        field: field.into(),
    }
}

/// A category's preference: off on every channel, or channel by channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CategoryPref {
    /// `true`: allowed (as unset); `false`: opted out on every channel.
    All(bool),
    /// Channel → allowed.
    Channels(BTreeMap<String, bool>),
}

/// Quiet hours: the windows (send-window syntax) in which the recipient wants
/// nothing, in their zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuietHours {
    /// The zone; `None`: the job's.
    pub timezone: Option<Tz>,
    /// The quiet windows.
    pub windows: SendWindows,
    /// The priorities that pass through them (default `["urgent"]`).
    pub allow: Vec<Priority>,
}

impl QuietHours {
    /// The first instant at or after `at` outside every quiet window (`at` itself
    /// when it is not quiet), in `tz` unless the set names its zone.
    pub fn end(&self, tz: Tz, at: DateTime<Utc>) -> DateTime<Utc> {
        self.windows.next_closed(self.timezone.unwrap_or(tz), at)
    }

    /// The first instant at or after `at` inside a quiet window; `None`: never.
    pub fn next_start(&self, tz: Tz, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.windows.next_open(self.timezone.unwrap_or(tz), at)
    }
}

/// One recipient's set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Preferences {
    /// Category → preference.
    pub categories: BTreeMap<String, CategoryPref>,
    /// Channel → allowed.
    pub channels: BTreeMap<String, bool>,
    /// Quiet hours, if any.
    pub quiet_hours: Option<QuietHours>,
}

/// What a job is opted out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptOut {
    /// Its category, on every channel.
    Category,
    /// Its channel, for every category.
    Channel,
    /// Its category on its channel.
    Pair,
}

impl OptOut {
    /// Every opt-out, with its number and name in `src/admission/lua/protocol.lua`
    /// (`OPTED_OUT`, the payload of an `opted_out` answer).
    pub const ALL: [(OptOut, i64, &'static str); 3] = [
        (OptOut::Category, 1, "category"),
        (OptOut::Channel, 2, "channel"),
        (OptOut::Pair, 3, "pair"),
    ];

    /// The opt-out `src/admission/lua/` names by `code`.
    pub fn from_code(code: i64) -> Option<OptOut> {
        OptOut::ALL
            .iter()
            .find(|(_, n, _)| *n == code)
            .map(|(o, ..)| *o)
    }

    /// The dead letter's detail: `category marketing`, `channel sms`, or
    /// `category reminders, channel sms`.
    pub fn describe(self, category: &str, channel: &str) -> String {
        match self {
            OptOut::Category => format!("category {category}"),
            OptOut::Channel => format!("channel {channel}"),
            OptOut::Pair => format!("category {category}, channel {channel}"),
        }
    }
}

/// The hash fields that say a job of `category` on `channel` is opted out, in the
/// order of [`OptOut::from_code`].
pub fn fields(category: &str, channel: &str) -> [String; 3] {
    [
        format!("c:{category}"),
        format!("h:{channel}"),
        format!("p:{category}:{channel}"),
    ]
}

fn bool_at(v: &Value, field: &str) -> Result<bool, Invalid> {
    v.as_bool()
        .ok_or_else(|| invalid(field, "must be true or false"))
}

fn name_ok(name: &str, field: &str) -> Result<(), Invalid> {
    if name.is_empty() || name.len() > 200 || name.contains(':') {
        return Err(invalid(field, "a name is 1 to 200 bytes without `:`"));
    }
    Ok(())
}

fn object<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, Invalid> {
    v.as_object()
        .ok_or_else(|| invalid(field, "must be an object"))
}

impl Preferences {
    /// The set `value` says, checked whole: unknown keys, times, zones, days,
    /// priorities, and channels `channel_known` does not know are refused.
    pub fn parse(
        value: &Value,
        channel_known: &dyn Fn(&str) -> bool,
    ) -> Result<Preferences, Invalid> {
        let mut set = Preferences::default();
        let top = object(value, "")?;
        let channel = |name: &str, field: &str| -> Result<(), Invalid> {
            name_ok(name, field)?;
            if channel_known(name) {
                Ok(())
            } else {
                Err(invalid(
                    field,
                    format!("channel `{name}` is not configured"),
                ))
            }
        };
        for (key, v) in top {
            match key.as_str() {
                "categories" => {
                    for (cat, pref) in object(v, "categories")? {
                        let field = format!("categories.{cat}");
                        name_ok(cat, &field)?;
                        let pref = match pref {
                            Value::Bool(b) => CategoryPref::All(*b),
                            Value::Object(m) => {
                                let mut chans = BTreeMap::new();
                                for (ch, b) in m {
                                    let field = format!("categories.{cat}.{ch}");
                                    channel(ch, &field)?;
                                    chans.insert(ch.clone(), bool_at(b, &field)?);
                                }
                                CategoryPref::Channels(chans)
                            }
                            _ => {
                                return Err(invalid(
                                    field,
                                    "must be false, true or an object of channel to true/false",
                                ))
                            }
                        };
                        set.categories.insert(cat.clone(), pref);
                    }
                }
                "channels" => {
                    for (ch, b) in object(v, "channels")? {
                        let field = format!("channels.{ch}");
                        channel(ch, &field)?;
                        set.channels.insert(ch.clone(), bool_at(b, &field)?);
                    }
                }
                "quiet_hours" => set.quiet_hours = Some(quiet(v)?),
                // written by GET, accepted back so a read set can be PUT as is
                "updated_at" => {}
                other => return Err(invalid(other, format!("unknown key `{other}`"))),
            }
        }
        Ok(set)
    }

    /// The set as JSON, as `GET` shows it (without `updated_at`).
    pub fn to_json(&self) -> Value {
        let mut top = Map::new();
        if !self.categories.is_empty() {
            let cats = self
                .categories
                .iter()
                .map(|(c, p)| {
                    let v = match p {
                        CategoryPref::All(b) => Value::Bool(*b),
                        CategoryPref::Channels(m) => Value::Object(
                            m.iter()
                                .map(|(k, b)| (k.clone(), Value::Bool(*b)))
                                .collect(),
                        ),
                    };
                    (c.clone(), v)
                })
                .collect();
            top.insert("categories".into(), Value::Object(cats));
        }
        if !self.channels.is_empty() {
            let chans = self
                .channels
                .iter()
                .map(|(k, b)| (k.clone(), Value::Bool(*b)))
                .collect();
            top.insert("channels".into(), Value::Object(chans));
        }
        if let Some(q) = &self.quiet_hours {
            let mut m = Map::new();
            if let Some(tz) = q.timezone {
                m.insert("timezone".into(), Value::String(tz.name().into()));
            }
            let windows = q
                .windows
                .openings()
                .iter()
                .map(|o| {
                    let crate::quota::send_windows::OpeningParts { days, from, to } = o.parts();
                    let days = if days == "mon,tue,wed,thu,fri,sat,sun" {
                        "daily".into()
                    } else {
                        days
                    };
                    serde_json::json!({"days": days, "from": from, "to": to})
                })
                .collect();
            m.insert("windows".into(), Value::Array(windows));
            let allow = q
                .allow
                .iter()
                .map(|p| Value::String(p.as_str().into()))
                .collect();
            m.insert("allow".into(), Value::Array(allow));
            top.insert("quiet_hours".into(), Value::Object(m));
        }
        Value::Object(top)
    }

    /// The opt-out fields of the stored hash (each holds `1`).
    pub fn opt_out_fields(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (cat, pref) in &self.categories {
            match pref {
                CategoryPref::All(false) => out.push(format!("c:{cat}")),
                CategoryPref::All(true) => {}
                CategoryPref::Channels(m) => out.extend(
                    m.iter()
                        .filter(|(_, b)| !**b)
                        .map(|(ch, _)| format!("p:{cat}:{ch}")),
                ),
            }
        }
        out.extend(
            self.channels
                .iter()
                .filter(|(_, b)| !**b)
                .map(|(ch, _)| format!("h:{ch}")),
        );
        out
    }
}

fn quiet(v: &Value) -> Result<QuietHours, Invalid> {
    let m = object(v, "quiet_hours")?;
    let mut timezone = None;
    let mut windows = None;
    let mut allow = vec![Priority::Urgent];
    for (key, v) in m {
        match key.as_str() {
            "timezone" => {
                let field = "quiet_hours.timezone";
                let name = v
                    .as_str()
                    .ok_or_else(|| invalid(field, "must be a string"))?;
                let tz: Tz = name
                    .parse()
                    .map_err(|_| invalid(field, format!("`{name}` is not an IANA time zone")))?;
                timezone = Some(tz);
            }
            "windows" => {
                let list = v
                    .as_array()
                    .ok_or_else(|| invalid("quiet_hours.windows", "must be a list"))?;
                let mut openings = Vec::with_capacity(list.len());
                for (i, w) in list.iter().enumerate() {
                    openings.push(window(w, &format!("quiet_hours.windows[{i}]"))?);
                }
                windows = Some(SendWindows::new(openings));
            }
            "allow" => {
                let list = v
                    .as_array()
                    .ok_or_else(|| invalid("quiet_hours.allow", "must be a list"))?;
                allow = Vec::with_capacity(list.len());
                for (i, p) in list.iter().enumerate() {
                    let field = format!("quiet_hours.allow[{i}]");
                    let p = p
                        .as_str()
                        .and_then(|s| Priority::ALL.into_iter().find(|p| p.as_str() == s))
                        .ok_or_else(|| invalid(field, "must be `urgent`, `normal` or `bulk`"))?;
                    allow.push(p);
                }
            }
            other => {
                return Err(invalid(
                    format!("quiet_hours.{other}"),
                    format!("unknown key `{other}`"),
                ))
            }
        }
    }
    let windows = windows.ok_or_else(|| invalid("quiet_hours.windows", "is required"))?;
    Ok(QuietHours {
        timezone,
        windows,
        allow,
    })
}

fn window(v: &Value, at: &str) -> Result<Opening, Invalid> {
    let m = object(v, at)?;
    let text = |key: &str| -> Result<&str, Invalid> {
        m.get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("{at}.{key}"), "is required, a string"))
    };
    if let Some(other) = m
        .keys()
        .find(|k| !["days", "from", "to"].contains(&k.as_str()))
    {
        return Err(invalid(
            format!("{at}.{other}"),
            format!("unknown key `{other}`"),
        ));
    }
    let (days, from, to) = (text("days")?, text("from")?, text("to")?);
    parse_days(days).map_err(|e| invalid(format!("{at}.days"), e.0))?;
    parse_time(from, false).map_err(|e| invalid(format!("{at}.from"), e.0))?;
    parse_time(to, true).map_err(|e| invalid(format!("{at}.to"), e.0))?;
    Opening::parse(days, from, to).map_err(|e| invalid(format!("{at}.to"), e.0))
}

/// The keys a set has at its top, and in its `quiet_hours`.
const SET_KEYS: [&str; 4] = ["categories", "channels", "quiet_hours", "updated_at"];
const QUIET_KEYS: [&str; 3] = ["timezone", "windows", "allow"];

/// A merge patch's keys that no set has, refused even when `null` (which would
/// remove nothing): a misspelt key is an error, not a patch that does nothing.
/// The names inside `categories` and `channels` are the recipient's own: a `null`
/// there removes whatever name it gives.
pub fn patch_keys_known(patch: &Value) -> Result<(), Invalid> {
    let Some(top) = patch.as_object() else {
        return Ok(());
    };
    if let Some(other) = top.keys().find(|k| !SET_KEYS.contains(&k.as_str())) {
        return Err(invalid(other, format!("unknown key `{other}`")));
    }
    let quiet = top.get("quiet_hours").and_then(Value::as_object);
    match quiet.and_then(|q| q.keys().find(|k| !QUIET_KEYS.contains(&k.as_str()))) {
        Some(other) => Err(invalid(
            format!("quiet_hours.{other}"),
            format!("unknown key `{other}`"),
        )),
        None => Ok(()),
    }
}

/// RFC 7386: `patch` merged into `target` (`null` removes a key).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    fn known(ch: &str) -> bool {
        ["sms", "email"].contains(&ch)
    }

    #[test]
    fn the_issue_example_parses_and_round_trips() {
        let v = json!({ "categories": { "marketing": false, "reminders": { "sms": false } },
            "channels": { "sms": false },
            "quiet_hours": { "timezone": "Europe/Berlin",
                "windows": [ { "days": "daily", "from": "22:00", "to": "07:00" } ],
                "allow": ["urgent"] } });
        let set = Preferences::parse(&v, &known).unwrap();
        assert_eq!(set.to_json(), v);
        assert_eq!(
            set.opt_out_fields(),
            ["c:marketing", "p:reminders:sms", "h:sms"]
        );
    }

    #[test]
    fn every_bad_input_names_its_field() {
        let cases = [
            (json!({"colour": 1}), "colour"),
            (json!({"channels": {"fax": false}}), "channels.fax"),
            (
                json!({"categories": {"a": {"fax": false}}}),
                "categories.a.fax",
            ),
            (json!({"categories": {"a": 3}}), "categories.a"),
            (
                json!({"quiet_hours": {"windows": [{"days": "daily", "from": "25:00", "to": "07:00"}]}}),
                "quiet_hours.windows[0].from",
            ),
            (
                json!({"quiet_hours": {"windows": [{"days": "daily", "from": "22:00", "to": "7"}]}}),
                "quiet_hours.windows[0].to",
            ),
            (
                json!({"quiet_hours": {"windows": [{"days": "funday", "from": "22:00", "to": "07:00"}]}}),
                "quiet_hours.windows[0].days",
            ),
            (
                json!({"quiet_hours": {"timezone": "Mars/Base", "windows": []}}),
                "quiet_hours.timezone",
            ),
            (
                json!({"quiet_hours": {"windows": [], "allow": ["asap"]}}),
                "quiet_hours.allow[0]",
            ),
        ];
        for (v, field) in cases {
            assert_eq!(
                Preferences::parse(&v, &known).unwrap_err().field,
                field,
                "{v}"
            );
        }
    }

    #[test]
    fn a_patch_naming_a_key_no_set_has_is_refused_even_with_null() {
        for (patch, field) in [
            (json!({"": null}), ""),
            (json!({"quite_hours": null}), "quite_hours"),
            (json!({"quiet_hours": {"zone": null}}), "quiet_hours.zone"),
        ] {
            let bad = patch_keys_known(&patch).expect_err("refused");
            assert_eq!(bad.field, field, "{patch}");
        }
        for patch in [
            json!({"quiet_hours": null, "updated_at": null}),
            json!({"categories": {"anything": null}, "channels": {"fax": null}}),
            json!({"quiet_hours": {"allow": null, "timezone": "UTC"}}),
        ] {
            assert!(patch_keys_known(&patch).is_ok(), "{patch}");
        }
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut t = json!({"channels": {"sms": false}, "categories": {"a": false}});
        merge_patch(
            &mut t,
            &json!({"channels": {"sms": null, "email": false}, "categories": null}),
        );
        assert_eq!(t, json!({"channels": {"email": false}}));
    }

    #[test]
    fn quiet_hours_across_midnight_end_in_the_morning_and_follow_dst() {
        let v = json!({"quiet_hours": {"timezone": "Europe/Berlin",
            "windows": [{"days": "daily", "from": "22:00", "to": "07:00"}]}});
        let q = Preferences::parse(&v, &known).unwrap().quiet_hours.unwrap();
        let utc = |y, mo, d, h, mi| Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap();
        // 23:30 Berlin (CET, +1) → 07:00 Berlin = 06:00 UTC
        assert_eq!(
            q.end(Tz::UTC, utc(2026, 1, 14, 22, 30)),
            utc(2026, 1, 15, 6, 0)
        );
        // outside: itself
        assert_eq!(
            q.end(Tz::UTC, utc(2026, 1, 14, 12, 0)),
            utc(2026, 1, 14, 12, 0)
        );
        // the night clocks go forward (29 March 2026): 07:00 CEST = 05:00 UTC
        assert_eq!(
            q.end(Tz::UTC, utc(2026, 3, 28, 23, 0)),
            utc(2026, 3, 29, 5, 0)
        );
        // the night they go back (25 October 2026): 07:00 CET = 06:00 UTC
        assert_eq!(
            q.end(Tz::UTC, utc(2026, 10, 24, 23, 0)),
            utc(2026, 10, 25, 6, 0)
        );
    }
}
