//! How durations, zones, windows and send windows are written in the file, parsed
//! when the configuration is read (so a bad one is an error naming its key) and
//! printed back the same way by `config check`.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::quota::window::Window;

/// A duration written as `"500ms"`, `"30s"`, `"10m"` or `"24h"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match Window::from_str(&text) {
            Ok(Window::Rolling(d)) => d
                .to_std()
                .map(Dur)
                .map_err(|_| serde::de::Error::custom(format!("`{text}` is not a duration"))),
            Ok(Window::CalendarDays(_) | Window::CalendarMonths(_)) => Err(serde::de::Error::custom(format!(
                "`{text}` is a calendar window; write a duration such as \"30s\", \"10m\" or \"24h\""
            ))),
            Err(e) => Err(serde::de::Error::custom(e)),
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let w = chrono::Duration::from_std(self.0).map_err(serde::ser::Error::custom)?;
        s.collect_str(&Window::Rolling(w))
    }
}

/// A zone written by its IANA name, parsed when the configuration is read.
pub(super) mod zone_name {
    use chrono_tz::Tz;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Tz, D::Error> {
        let name = String::deserialize(d)?;
        name.parse::<Tz>()
            .map_err(|_| serde::de::Error::custom(format!("`{name}` is not an IANA time zone")))
    }

    pub(crate) fn serialize<S: Serializer>(tz: &Tz, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(tz.name())
    }
}

/// A window written as `"1d"` or `"90m"`, parsed when the configuration is read,
/// and at most 366 days long.
pub(super) mod window_text {
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    use crate::quota::window::Window;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Window, D::Error> {
        let text = String::deserialize(d)?;
        let window = Window::from_str(&text).map_err(serde::de::Error::custom)?;
        let too_long = match window {
            Window::CalendarDays(days) => days > 366,
            Window::CalendarMonths(months) => months > 12,
            Window::Rolling(d) => d > chrono::Duration::days(366),
        };
        if too_long {
            return Err(serde::de::Error::custom("at most 366 days (12 months)"));
        }
        Ok(window)
    }

    pub(crate) fn serialize<S: Serializer>(w: &Window, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(w)
    }
}

/// Send windows written as `[{ days = "mon-fri", from = "08:00", to = "21:00" }]`,
/// parsed when the configuration is read.
pub(super) mod send_windows_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::quota::send_windows::{Opening, SendWindows};

    #[derive(Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    struct Written {
        days: String,
        from: String,
        to: String,
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SendWindows>, D::Error> {
        let Some(written) = Option::<Vec<Written>>::deserialize(d)? else {
            return Ok(None);
        };
        let openings = written
            .iter()
            .map(|w| Opening::parse(&w.days, &w.from, &w.to))
            .collect::<Result<Vec<_>, _>>()
            .map_err(serde::de::Error::custom)?;
        if openings.is_empty() {
            return Err(serde::de::Error::custom(
                "an empty list never opens; leave `send_windows` out for no restriction",
            ));
        }
        Ok(Some(SendWindows::new(openings)))
    }

    pub(crate) fn serialize<S: Serializer>(
        w: &Option<SendWindows>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let written: Option<Vec<Written>> = w.as_ref().map(|w| {
            w.openings()
                .iter()
                .map(|o| {
                    let p = o.parts();
                    Written {
                        days: p.days,
                        from: p.from,
                        to: p.to,
                    }
                })
                .collect()
        });
        written.serialize(s)
    }
}
