//! The worker's HTTP endpoint (`/readyz`, `/metrics`) and the Prometheus text it
//! serves: outcome counts, quantiles of a histogram or summary, sums of a series.
//! The parsing is pure; only [`get`] and [`scrape`] do I/O.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

use anyhow::Result;

/// The worker's `/metrics` on `port`.
pub fn scrape(port: u16) -> Result<String> {
    get(port, "/metrics")
}

/// One HTTP/1.0 GET on loopback: the whole response, status line first.
pub fn get(port: u16, path: &str) -> Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

/// Jobs by `outcome` (and `:reason`, where one is given) of
/// `quota_worker_jobs_total`; outcomes at 0 left out.
pub fn outcome_counts(metrics: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("quota_worker_jobs_total{"))
    {
        let label = |name: &str| {
            line.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let (outcome, reason) = (label("outcome"), label("reason"));
        let key = if reason.is_empty() {
            outcome
        } else {
            format!("{outcome}:{reason}")
        };
        let v: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        // the worker shows every outcome from the start, most at 0
        if v > 0.0 {
            *out.entry(key).or_insert(0) += v as u64;
        }
    }
    out
}

/// Quantiles of a histogram or summary in Prometheus text. For a histogram, the
/// quantile is interpolated linearly inside its bucket, as Prometheus's
/// `histogram_quantile` does.
pub fn quantiles(metrics: &str, name: &str) -> HashMap<String, f64> {
    let mut buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    if !buckets.is_empty() {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
        let mut out = HashMap::new();
        for q in ["0.5", "0.99", "0.999"] {
            let target = q.parse::<f64>().unwrap() * total;
            let mut lower = (0.0, 0.0);
            for &(le, count) in &buckets {
                if count >= target && total > 0.0 {
                    let upper = if le.is_finite() { le } else { lower.0 };
                    let span = count - lower.1;
                    let frac = if span > 0.0 {
                        (target - lower.1) / span
                    } else {
                        1.0
                    };
                    out.insert(q.to_string(), lower.0 + (upper - lower.0) * frac);
                    break;
                }
                lower = (le, count);
            }
        }
        return out;
    }
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{quantile=\"")))
        .filter_map(|l| {
            let q = l
                .split("quantile=\"")
                .nth(1)?
                .split('"')
                .next()?
                .to_string();
            let v = l.rsplit(' ').next()?.parse().ok()?;
            Some((q, v))
        })
        .collect()
}

/// The sum of every sample whose series name starts with `name` (none: `None`).
pub fn metric_sum(metrics: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The sum of the samples of `name` whose labels include every one of `labels`
/// (`name="value"`), whatever their order (none: 0).
pub fn labelled_sum(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let open = format!("{name}{{");
    metrics
        .lines()
        .filter(|l| l.starts_with(&open))
        .filter(|l| {
            let set = l.split('}').next().unwrap_or("");
            labels
                .iter()
                .all(|(k, v)| set.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_labelled_sum_takes_the_series_with_every_label_in_any_order() {
        let text = "# TYPE quota_worker_lane_jobs_total counter\n\
            quota_worker_lane_jobs_total{channel=\"sms\",lane=\"bulk\",step=\"parked\"} 7\n\
            quota_worker_lane_jobs_total{step=\"parked\",lane=\"bulk\",channel=\"email\"} 3\n\
            quota_worker_lane_jobs_total{channel=\"sms\",lane=\"urgent\",step=\"parked\"} 5\n\
            quota_worker_lane_jobs_total{channel=\"sms\",lane=\"bulk\",step=\"taken\"} 11\n\
            quota_worker_lane_jobs_totally{lane=\"bulk\",step=\"parked\"} 100\n";
        let name = "quota_worker_lane_jobs_total";
        let parked_bulk = [("lane", "bulk"), ("step", "parked")];
        assert_eq!(labelled_sum(text, name, &parked_bulk), 10.0);
        let sms = [("channel", "sms"), ("lane", "bulk"), ("step", "parked")];
        assert_eq!(labelled_sum(text, name, &sms), 7.0);
        assert_eq!(labelled_sum(text, "nothing", &sms), 0.0);
    }
}
