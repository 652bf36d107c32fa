//! The plot, `<out>/bench.svg`: throughput, admission latency and the worker's RSS
//! on top; end-to-end latency by quantile (with the lanes step's urgent jobs) and
//! the scale step's CPU per job below.
//! With the recovery step, `<out>/recovery.svg`: each pass's drain rate by 5-second
//! interval against the channel's rate. Draws the report only.

use std::path::Path;

use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{EndToEnd, Latency, Report};

type Area<'b> = DrawingArea<SVGBackend<'b>, Shift>;
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Writes the five panels of `r` to `path`.
pub fn plot(r: &Report, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (1440, 840)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(420);
    let (e2e, scale_panel) = lower.split_horizontally(720);
    plot_end_to_end(r, &e2e)?;
    plot_scale(r, &scale_panel)?;
    let (left, rest) = upper.split_horizontally(480);
    let (right, memory) = rest.split_horizontally(480);
    plot_throughput(r, &left)?;
    plot_admission(r, &right)?;
    plot_rss(r, &memory)?;
    root.present()?;
    Ok(())
}

/// A panel with linear axes from 0 to `x` and 0 to `y`, its mesh not drawn yet.
fn chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    font_size: u32,
    x: f64,
    y: f64,
) -> Result<Chart<'a, 'b>> {
    Ok(ChartBuilder::on(area)
        .caption(caption, ("sans-serif", font_size))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x, 0f64..y)?)
}

/// The mesh of a panel of bars: no x labels and no vertical grid lines.
fn bars_mesh(chart: &mut Chart<'_, '_>) -> Result<()> {
    chart.configure_mesh().disable_x_mesh().x_labels(0).draw()?;
    Ok(())
}

/// One filled bar from `(x0, y0)` to `(x1, y1)`.
fn bar(chart: &mut Chart<'_, '_>, from: (f64, f64), to: (f64, f64), color: RGBColor) -> Result<()> {
    chart.draw_series(std::iter::once(Rectangle::new(
        [from, to],
        color.mix(0.6).filled(),
    )))?;
    Ok(())
}

/// Text at `at`.
fn label(chart: &mut Chart<'_, '_>, text: String, at: (f64, f64), size: u32) -> Result<()> {
    chart.draw_series(std::iter::once(Text::new(text, at, ("sans-serif", size))))?;
    Ok(())
}

/// Jobs per second: the mean ceiling, then each mix.
fn plot_throughput(r: &Report, area: &Area<'_>) -> Result<()> {
    let mut bars: Vec<(String, f64)> = vec![("ceiling".into(), r.ceiling_jobs_per_sec)];
    bars.extend(r.mixes.iter().map(|m| (m.name.clone(), m.jobs_per_sec)));
    let top = bars.iter().map(|b| b.1).fold(1.0, f64::max) * 1.15;
    let mut chart = chart(area, "Throughput (jobs/s)", 18, bars.len() as f64, top)?;
    bars_mesh(&mut chart)?;
    for (i, (name, v)) in bars.iter().enumerate() {
        let x = i as f64;
        bar(&mut chart, (x + 0.15, 0.0), (x + 0.85, *v), BLUE)?;
        label(
            &mut chart,
            format!("{name}: {v:.0}"),
            (x + 0.1, v + top * 0.03),
            12,
        )?;
    }
    Ok(())
}

/// Admission p50, p99 and p99.9: each mix, then each latency pass of the first
/// round.
fn plot_admission(r: &Report, area: &Area<'_>) -> Result<()> {
    let lat: Vec<(String, [f64; 3])> = r
        .mixes
        .iter()
        .map(|m| {
            (
                m.name.clone(),
                [
                    m.admission_p50_ms.unwrap_or(0.0),
                    m.admission_p99_ms.unwrap_or(0.0),
                    m.admission_p999_ms.unwrap_or(0.0),
                ],
            )
        })
        .chain(r.latency.iter().filter(|l| l.round == 0).map(|l| {
            (
                format!("{}x, {}", l.share_of_ceiling, l.scheduling),
                [
                    l.admission_p50_ms.unwrap_or(0.0),
                    l.admission_p99_ms.unwrap_or(0.0),
                    l.admission_p999_ms.unwrap_or(0.0),
                ],
            )
        }))
        .collect();
    let top = lat.iter().flat_map(|l| l.1).fold(0.1, f64::max) * 1.2;
    let mut chart = chart(
        area,
        "Admission latency (ms): p50, p99, p99.9",
        18,
        lat.len().max(1) as f64,
        top,
    )?;
    bars_mesh(&mut chart)?;
    let colors = [GREEN, RED, BLACK];
    for (i, (name, qs)) in lat.iter().enumerate() {
        for (j, v) in qs.iter().enumerate() {
            let x = i as f64 + 0.1 + j as f64 * 0.27;
            bar(&mut chart, (x, 0.0), (x + 0.25, *v), colors[j])?;
        }
        label(&mut chart, name.clone(), (i as f64 + 0.1, top * 0.95), 12)?;
    }
    Ok(())
}

/// The worker's RSS over each mix's drain.
fn plot_rss(r: &Report, area: &Area<'_>) -> Result<()> {
    let secs = r
        .mixes
        .iter()
        .flat_map(|m| m.rss_curve_mib.last().map(|p| p.0))
        .fold(1.0, f64::max);
    let mib = r
        .mixes
        .iter()
        .flat_map(|m| m.rss_curve_mib.iter().map(|p| p.1))
        .fold(8.0, f64::max)
        * 1.2;
    let mut chart = chart(area, "Worker RSS (MiB) while draining", 18, secs, mib)?;
    chart.configure_mesh().x_desc("seconds").draw()?;
    let palette = [BLUE, RED, GREEN, BLACK];
    for (i, m) in r.mixes.iter().enumerate() {
        let color = palette[i % palette.len()];
        chart
            .draw_series(LineSeries::new(m.rss_curve_mib.iter().copied(), color))?
            .label(m.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// End-to-end latency by quantile, worker and pass-through on one panel: for each
/// offered share of the ceiling, the round whose worker p99 is the median one. The
/// x axis is in nines (1 = p90, 2 = p99, 3 = p99.9), the y axis logarithmic.
fn plot_end_to_end(r: &Report, area: &Area<'_>) -> Result<()> {
    let lines = end_to_end_curves(r);
    let x_max = lines
        .iter()
        .flat_map(|l| l.1.last().map(|p| p.0))
        .fold(1.0, f64::max)
        .ceil();
    let y_max = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.5;
    let y_min = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .fold(y_max, f64::min)
        / 1.5;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "End-to-end latency (ms, publish to dispatch queue) by quantile",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, (y_min..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("quantile (the last point of a curve is its maximum)")
        .x_labels(x_max as usize + 1)
        .x_label_formatter(&|x| {
            let q = 100.0 * (1.0 - 10f64.powf(-x));
            format!("p{}", (q * 1000.0).round() / 1000.0)
        })
        .draw()?;
    for (name, points, color) in lines {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// A curve's legend, its points (nines, ms) and colour.
type Curve = (String, Vec<(f64, f64)>, RGBColor);

/// For each offered share, the worker's and the pass-through's curves of the round
/// whose worker p99 is the median one; then the lanes step's urgent jobs.
fn end_to_end_curves(r: &Report) -> Vec<Curve> {
    let mut lines: Vec<Curve> = Vec::new();
    let colors = [(RED, BLUE), (MAGENTA, CYAN)];
    for (k, share) in [0.5, 0.25].into_iter().enumerate() {
        let mut ls: Vec<&Latency> = r
            .latency
            .iter()
            .filter(|l| l.share_of_ceiling == share && l.pass_through.is_some())
            .collect();
        ls.sort_by(|a, b| {
            let p = |l: &Latency| l.end_to_end.as_ref().map_or(0.0, |e| e.p99_ms);
            p(a).total_cmp(&p(b))
        });
        let Some(l) = ls.get(ls.len() / 2) else {
            continue;
        };
        let (wc, pc) = colors[k];
        if let Some(e) = &l.end_to_end {
            lines.push((
                format!(
                    "worker, {share} x ceiling ({:.0}/s)",
                    l.offered_jobs_per_sec
                ),
                nines(e),
                wc,
            ));
        }
        if let Some(e) = &l.pass_through {
            lines.push((format!("pass-through, {share} x ceiling"), nines(e), pc));
        }
    }
    // the lanes step: urgent jobs behind a paced bulk backlog
    for (l, color) in r.lanes.iter().zip([GREEN, BLACK]) {
        lines.push((
            format!(
                "urgent behind {} bulk at {}/s, {} worker(s)",
                l.backlog, l.rate, l.workers
            ),
            nines(&l.urgent),
            color,
        ));
    }
    lines
}

/// An end-to-end curve as (nines, ms) points.
fn nines(e: &EndToEnd) -> Vec<(f64, f64)> {
    e.curve
        .iter()
        .map(|&(q, ms)| (-(1.0 - q).max(1e-9).log10(), ms.max(0.01)))
        .collect()
}

/// The scale step: CPU per job (broker, Redis, worker stacked) for each
/// configuration, its ratio to the paired ceiling written above.
fn plot_scale(r: &Report, area: &Area<'_>) -> Result<()> {
    let top = r
        .scale
        .iter()
        .map(|x| x.cpu_us_per_job_parts.iter().sum::<f64>())
        .fold(10.0, f64::max)
        * 1.25;
    let mut chart = chart(
        area,
        "CPU per job (us; blue broker, red Redis, green worker): recipients, policies",
        16,
        r.scale.len().max(1) as f64,
        top,
    )?;
    bars_mesh(&mut chart)?;
    let colors = [BLUE, RED, GREEN];
    for (i, x) in r.scale.iter().enumerate() {
        let mut base = 0.0;
        for (j, v) in x.cpu_us_per_job_parts.iter().enumerate() {
            let x0 = i as f64 + 0.2;
            bar(&mut chart, (x0, base), (x0 + 0.6, base + v), colors[j])?;
            base += v;
        }
        label(
            &mut chart,
            format!(
                "{} rcpt, {} pol: {:.2}x",
                x.recipients, x.policies, x.ratio_to_ceiling
            ),
            (i as f64 + 0.05, base + top * 0.04),
            11,
        )?;
    }
    Ok(())
}

/// The recovery step: each pass's dispatched jobs per second by 5-second interval,
/// as a share of the channel's rate (1.0, drawn dashed), against seconds since the
/// drain began.
pub fn plot_recovery(r: &Report, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let step = crate::report::INTERVAL_SECS as f64;
    let longest = r
        .recovery
        .iter()
        .flat_map(|p| p.interval_ends())
        .fold(step, f64::max);
    let mut chart = chart(
        &root,
        "Lane drain after a fault: jobs/s per 5 s interval / the channel's rate",
        18,
        longest,
        1.3,
    )?;
    chart
        .configure_mesh()
        .x_desc("seconds since the drain began")
        .y_desc("share of the rate")
        .draw()?;
    chart.draw_series(DashedLineSeries::new(
        [(0.0, 1.0), (longest, 1.0)],
        6,
        4,
        BLACK.stroke_width(1),
    ))?;
    let colors = [BLUE, RED, GREEN, MAGENTA];
    for (p, color) in r.recovery.iter().zip(colors) {
        let points: Vec<(f64, f64)> = p
            .interval_ends()
            .zip(&p.intervals)
            .map(|(t, v)| (t, v / p.rate as f64))
            .collect();
        let name = format!(
            "{} worker(s){}: {:.2} whole drain",
            p.workers,
            if p.broker_restart {
                ", broker restart"
            } else {
                ""
            },
            p.ratio_whole
        );
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
