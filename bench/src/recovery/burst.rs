//! The burst: bulk jobs published to the jobs exchange as fast as the benchmark can
//! while the workers read and park them in their lane.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::broker::{closed, connect, preload};
use crate::context::{header, Bench};
use crate::lanes::ready;
use crate::procs::{spawn_worker, stop, wait_ready};
use crate::report::Burst;

/// `jobs` bulk jobs published to the jobs exchange at once while `workers` workers
/// run, the channel paced at `rate`: how fast they are published and parked.
pub(super) async fn burst(b: &Bench, workers: usize, jobs: usize, rate: u64) -> Result<Burst> {
    header(
        "recovery",
        format!(
            "burst: {jobs} bulk jobs to the jobs exchange, {workers} worker(s), paced at {rate}/s"
        ),
    );
    let mut s = b.settings(&format!("rb{workers}"));
    if let Some(sms) = s.channels.get_mut("sms") {
        sms.rate = Some(rate);
    }
    let env = [(
        "QUOTA_WORKER__CHANNELS__SMS__RATE".to_string(),
        rate.to_string(),
    )];
    let mut procs = Vec::new();
    let result = async {
        for _ in 0..workers {
            let (child, port) = spawn_worker(&b.worker, &s, &env)?;
            procs.push(child);
            wait_ready(port, procs.last_mut().expect("just pushed")).await?;
        }
        let conn = connect(&s.amqp.url).await?;
        let ns = &s.redis.key_prefix;
        let bodies = (0..jobs).map(|i| {
            format!(r#"{{"id":"{ns}-c{i}","recipient":"c{i}","channel":"sms","category":"transactional","priority":"bulk"}}"#)
                .into_bytes()
        });
        let ch = conn.create_channel().await?;
        ch.confirm_select(Default::default()).await?;
        let started = Instant::now();
        preload(&ch, &s.amqp.jobs_exchange, "", bodies).await?;
        let published = started.elapsed().as_secs_f64();
        let deadline = started + Duration::from_secs(600);
        while ready(&conn, &s.amqp.jobs_queue).await? > 0 {
            if Instant::now() > deadline {
                bail!("the jobs queue was not read within 10 minutes");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let parked = started.elapsed().as_secs_f64();
        let _ = closed(conn.close(200, "bye".into())).await;
        let (publish, parking) = (jobs as f64 / published, jobs as f64 / parked);
        Ok(Burst {
            workers,
            jobs,
            publish_per_sec: publish,
            parking_per_sec: parking,
            urgent_wait_secs: (parked - published).max(0.0),
        })
    }
    .await;
    for child in &mut procs {
        stop(child);
    }
    b.teardown.namespace(&s).await;
    result
}
