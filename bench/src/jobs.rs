//! The job bodies each step publishes: the three mixes, the latency step's jobs, the
//! scale step's, whose recipients and policies the scale step's keys are written
//! for, and the fallback step's. Pure: no I/O.

use rand::SeedableRng;
use rand_distr::Distribution;

/// `n` job bodies of `mix`: `a-allowed` (distinct recipients), `b-zipf` (Zipf-skewed
/// recipients), `scale:<recipients>:<policies>:<round>` ([`scale_job`]),
/// `f-routed` and `f-warm` ([`routed_job`], [`warm_job`]), `f-alert` and `f-plain`
/// ([`alert_job`] with and without a route), else malformed (no recipient).
pub fn job_bodies(mix: &str, n: usize) -> Box<dyn Iterator<Item = Vec<u8>>> {
    match mix {
        "a-allowed" => Box::new((0..n).map(|i| format!(r#"{{"id":"a{i}","recipient":"user{i}@example.com","channel":"sms","timezone":"Europe/Paris","payload":{{"text":"Your code is {i}"}}}}"#).into_bytes())),
        "b-zipf" => {
            let zipf = rand_distr::Zipf::new(100_000.0, 1.1).expect("zipf");
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            Box::new((0..n).map(move |i| {
                let who = zipf.sample(&mut rng) as u64;
                format!(r#"{{"id":"b{i}","recipient":"user{who}@example.com","channel":"sms","timezone":"Asia/Shanghai","payload":{{"text":"news {i}"}}}}"#).into_bytes()
            }))
        }
        "f-routed" => Box::new((0..n).map(|i| routed_job(i).into_bytes())),
        "f-warm" => Box::new((0..n).map(|i| warm_job(i).into_bytes())),
        "f-alert" => Box::new((0..n as u64).map(|i| alert_job(i, true).into_bytes())),
        "f-plain" => Box::new((0..n as u64).map(|i| alert_job(i, false).into_bytes())),
        scale if scale.starts_with("scale:") => {
            // scale:<recipients>:<policies>:<round>, see `scale_job`
            let v: Vec<usize> = scale[6..].split(':').filter_map(|v| v.parse().ok()).collect();
            let (recipients, policies, round) = (v[0], v[1], v[2]);
            Box::new((0..n).map(move |i| scale_job(recipients, policies, round, n, i).into_bytes()))
        }
        _ => Box::new((0..n).map(|i| format!(r#"{{"id":"c{i}","channel":"sms","payload":"no recipient"}}"#).into_bytes())),
    }
}

/// Recipient `r` of the scale step, and the policy (category) its jobs and keys use
/// with `policies` policies in use: `default`, `p1` .. `p9` in turn.
pub fn scale_recipient(r: usize, policies: usize) -> (String, String) {
    let policy = match r % policies.max(1) {
        0 => "default".to_string(),
        k => format!("p{k}"),
    };
    (format!("s{r}@example.com"), policy)
}

/// Job `i` of `n` of a scale run: recipients spread over all `recipients` (a
/// stride coprime with them; each round starts further on, so that with many
/// recipients no key is hit twice over the rounds).
fn scale_job(recipients: usize, policies: usize, round: usize, n: usize, i: usize) -> String {
    let r = ((round * n + i) as u64 * 7919 % recipients as u64) as usize;
    let (who, policy) = scale_recipient(r, policies);
    format!(
        r#"{{"id":"s{recipients}p{policies}r{round}j{i}","recipient":"{who}","channel":"sms","category":"{policy}","timezone":"Europe/Paris","payload":{{"text":"Your code is {i}"}}}}"#
    )
}

/// Job `i` of the latency step: a recipient of its own.
pub fn latency_job(i: u64) -> String {
    format!(
        r#"{{"id":"l{i}","recipient":"lat{i}@example.com","channel":"sms","timezone":"Europe/Paris"}}"#
    )
}

/// Job `i` of the fallback step's routed drain: mix (a)'s job `i` (its recipient,
/// zone and payload, the `default` policy) on `push`, routed on to `email`, then
/// `sms`.
pub fn routed_job(i: usize) -> String {
    format!(
        r#"{{"id":"f{i}","recipient":"user{i}@example.com","channel":"push","fallback":["email","sms"],"timezone":"Europe/Paris","payload":{{"text":"Your code is {i}"}}}}"#
    )
}

/// Job `i` of the fallback step's warm-up: a push to recipient `2i` (every other
/// recipient of [`routed_job`]), of a category whose policy has no rules, so that it
/// fills that recipient's push cap and nothing else.
pub fn warm_job(i: usize) -> String {
    let r = 2 * i;
    format!(
        r#"{{"id":"w{r}","recipient":"user{r}@example.com","channel":"push","category":"warm","timezone":"Europe/Paris"}}"#
    )
}

/// Job `i` of the fallback step's escalations: category `alert` (a policy that
/// escalates), on push, routed on to email and sms when `routed`.
pub fn alert_job(i: u64, routed: bool) -> String {
    let fallback = if routed {
        r#""fallback":["email","sms"],"#
    } else {
        ""
    };
    format!(
        r#"{{"id":"e{i}","recipient":"user{i}@example.com","channel":"push","category":"alert",{fallback}"timezone":"Europe/Paris","payload":{{"text":"Your code is {i}"}}}}"#
    )
}
