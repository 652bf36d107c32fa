//! Windows read from and written as configuration text.

use chrono::Duration;

use super::ms;
use crate::quota::window::Window;

#[test]
fn window_parse_and_display() {
    #[rustfmt::skip]
    let ok: &[(&str, Window, &str)] = &[
        ("1d", Window::CalendarDays(1), "1d"),
        ("7d", Window::CalendarDays(7), "7d"),
        ("500ms", Window::Rolling(ms(500)), "500ms"),
        ("1500ms", Window::Rolling(ms(1_500)), "1500ms"),
        ("30s", Window::Rolling(Duration::seconds(30)), "30s"),
        ("10m", Window::Rolling(Duration::minutes(10)), "10m"),
        ("90m", Window::Rolling(Duration::minutes(90)), "90m"),
        ("24h", Window::Rolling(Duration::hours(24)), "24h"),
        ("60s", Window::Rolling(Duration::minutes(1)), "1m"),
        ("3600000ms", Window::Rolling(Duration::hours(1)), "1h"),
        ("07d", Window::CalendarDays(7), "7d"),
    ];
    for &(text, window, shown) in ok {
        assert_eq!(text.parse::<Window>(), Ok(window), "{text}");
        assert_eq!(window.to_string(), shown, "{text}");
        assert_eq!(shown.parse::<Window>(), Ok(window), "{shown}");
    }
    #[rustfmt::skip]
    let bad = [
        "", "0d", "7", "3w", "-1s", "1.5h", "0ms", "0h", "d", "ms",
        " 7d", "7d ", "7 d", "+7d", "7D", "1y", "1dd", "4294967296d", "99999999999999999999999s", "9223372036854775807h",
    ];
    for text in bad {
        let err = text.parse::<Window>().expect_err(text);
        let message = err.to_string();
        assert!(message.contains(&format!("{text:?}")), "{message}");
        for form in ["\"1d\"", "\"500ms\"", "\"30s\"", "\"10m\"", "\"24h\""] {
            assert!(message.contains(form), "{message}");
        }
        let _: &dyn std::error::Error = &err;
    }
    assert_eq!(
        "4294967295d".parse::<Window>(),
        Ok(Window::CalendarDays(u32::MAX))
    );
}
