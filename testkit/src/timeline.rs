//! A plot of series over time as an SVG document written by hand (the benchmark's
//! plotting library is not a dependency of the tests): panels stacked one above
//! the other on one time axis, each with its own vertical scale and legend, and
//! vertical marks (faults) drawn across every panel with their labels on top.

use std::fmt::Write;

/// One line of a panel: its name in the legend, its points (seconds, value) and its
/// colour (any SVG colour).
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// One panel: a title (with its unit) and its lines.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 960.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const PANEL: f64 = 150.0;
const GAP: f64 = 40.0;

/// A value for an axis label: 1234567 as 1.23M, 4321 as 4.3k.
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A step between time labels that gives five to ten of them over `span` seconds.
fn time_step(span: f64) -> f64 {
    for step in [10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0] {
        if span / step <= 10.0 {
            return step;
        }
    }
    7200.0
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The horizontal frame shared by every panel: `0..span` seconds over the plot's width.
struct Frame {
    span: f64,
    plot_w: f64,
}

impl Frame {
    /// The x coordinate of `t` seconds.
    fn x(&self, t: f64) -> f64 {
        LEFT + t.clamp(0.0, self.span) / self.span * self.plot_w
    }
}

/// One panel's box on the page and its vertical scale.
struct Area {
    top: f64,
    bottom: f64,
    max: f64,
}

impl Area {
    /// The box of the `i`-th panel, scaled to 1.1 times its largest value.
    fn of(i: usize, p: &Panel) -> Area {
        let top = TOP + i as f64 * (PANEL + GAP);
        let max = p
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|pt| pt.1))
            .fold(0.0, f64::max);
        let max = if max > 0.0 { max * 1.1 } else { 1.0 };
        Area {
            top,
            bottom: top + PANEL,
            max,
        }
    }

    /// The y coordinate of `v`.
    fn y(&self, v: f64) -> f64 {
        self.bottom - (v / self.max).clamp(0.0, 1.0) * PANEL
    }
}

/// The SVG document: `title` on top, `panels` over `0..span` seconds, `marks`
/// (seconds, label) across them.
pub fn render(title: &str, span: f64, panels: &[Panel], marks: &[(f64, String)]) -> String {
    let span = span.max(1.0);
    let height = TOP + panels.len() as f64 * (PANEL + GAP) + 10.0;
    let frame = Frame {
        span,
        plot_w: WIDTH - LEFT - RIGHT,
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="18" font-size="14">{}</text>"#,
        escape(title)
    );
    for (i, p) in panels.iter().enumerate() {
        let area = Area::of(i, p);
        panel_box(&mut o, &frame, &area, p);
        time_axis(&mut o, &frame, &area);
        for (k, s) in p.series.iter().enumerate() {
            series(&mut o, &frame, &area, (k, p.series.len()), s);
        }
        fault_marks(&mut o, &frame, &area, marks, i == 0);
    }
    o.push_str("</svg>\n");
    o
}

/// A panel's title, frame and value axis (five grid lines with their labels).
fn panel_box(o: &mut String, frame: &Frame, area: &Area, p: &Panel) {
    let (top, plot_w) = (area.top, frame.plot_w);
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="{}" font-size="12" font-weight="bold">{}</text>"#,
        top - 6.0,
        escape(&p.title)
    );
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#999"/>"##
    );
    for k in 0..=4 {
        let v = area.max * k as f64 / 4.0;
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 4.0,
            area.y(v) + 4.0,
            short(v),
            yy = area.y(v),
        );
    }
}

/// The time labels under a panel, in seconds or minutes.
fn time_axis(o: &mut String, frame: &Frame, area: &Area) {
    let step = time_step(frame.span);
    let mut t = 0.0;
    while t <= frame.span + 0.001 {
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            frame.x(t),
            area.bottom + 13.0,
            if step >= 60.0 {
                format!("{} min", (t / 60.0).round())
            } else {
                format!("{t:.0} s")
            }
        );
        t += step;
    }
}

/// The `k`-th of a panel's `of` lines, and its entry in the legend.
fn series(o: &mut String, frame: &Frame, area: &Area, (k, of): (usize, usize), s: &Series) {
    if s.points.is_empty() {
        return;
    }
    let pts: Vec<String> = s
        .points
        .iter()
        .map(|&(t, v)| format!("{:.1},{:.1}", frame.x(t), area.y(v)))
        .collect();
    let _ = writeln!(
        o,
        r#"<polyline fill="none" stroke="{}" stroke-width="1.3" points="{}"/>"#,
        s.color,
        pts.join(" ")
    );
    let lx = LEFT + frame.plot_w - 10.0 - (of - k) as f64 * 120.0 + 120.0;
    let top = area.top;
    let _ = writeln!(
        o,
        r#"<line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
        lx - 110.0,
        lx - 96.0,
        top + 12.0,
        top + 12.0,
        s.color,
        lx - 92.0,
        top + 16.0,
        escape(&s.name)
    );
}

/// The marks across a panel; over the first panel, their labels too.
fn fault_marks(
    o: &mut String,
    frame: &Frame,
    area: &Area,
    marks: &[(f64, String)],
    labelled: bool,
) {
    let (top, bottom) = (area.top, area.bottom);
    for (t, label) in marks {
        let _ = writeln!(
            o,
            r#"<line x1="{xx:.1}" x2="{xx:.1}" y1="{top}" y2="{bottom}" stroke="crimson" stroke-dasharray="4,3"/>"#,
            xx = frame.x(*t),
        );
        if labelled {
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{}" fill="crimson" text-anchor="middle" font-size="10">{}</text>"#,
                frame.x(*t),
                TOP - 22.0,
                escape(label)
            );
        }
    }
}
