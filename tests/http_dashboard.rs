//! The live view of the page table (`/dashboard`, `/dashboard/events`) against a real server:
//! every snapshot, rebuilt from the first full pool and the changed runs after it, must agree
//! with its own counts and with the page table's invariants (a block is in use exactly when a
//! running sequence's table holds it, shared exactly when several do; used + shared + cached +
//! free = all blocks), and the idle snapshot after a load with `/metrics`. A model with sliding-
//! window layers has its window group's pool checked the same way against the window tables.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::server::*;
use futures_util::StreamExt;
use pagewise::server::ServerOptions;
use serde_json::{Value, json};

/// A `/dashboard/events` stream, read event by event.
struct Events {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: String,
}

impl Events {
    async fn open(url: &str, bearer: Option<&str>) -> Self {
        let mut req = reqwest::Client::new().get(url);
        if let Some(key) = bearer {
            req = req.bearer_auth(key);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        Events {
            body: r.bytes_stream().map(|c| c.map(|b| b.to_vec())).boxed(),
            buf: String::new(),
        }
    }

    /// The next `snapshot` event's data (keep-alive comments skipped); panics after 30 s.
    async fn next(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Some(end) = self.buf.find("\n\n") {
                    let event: String = self.buf.drain(..end + 2).collect();
                    if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                        assert!(event.contains("event: snapshot"), "{event}");
                        return serde_json::from_str(data).unwrap();
                    }
                    continue;
                }
                let chunk = self.body.next().await.expect("stream ended").unwrap();
                self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        })
        .await
        .expect("no snapshot within 30 s")
    }
}

impl Events {
    /// Reads snapshots, each passed to `on_frame`, until `load` has returned and the engine has
    /// published its idle pool (the last snapshot before it waits for work); returns that one
    /// (`first` when no snapshot came).
    async fn follow(
        &mut self,
        first: Value,
        mut load: tokio::task::JoinHandle<()>,
        mut on_frame: impl FnMut(&Value),
    ) -> Value {
        let (mut last, mut load_done) = (first, false);
        while !(load_done && last["seqs"].as_array().unwrap().is_empty()) {
            tokio::select! {
                frame = self.next() => {
                    last = frame;
                    on_frame(&last);
                }
                joined = &mut load, if !load_done => {
                    joined.unwrap();
                    load_done = true;
                }
            }
        }
        // A snapshot without sequences can come before the last step's final tokens are
        // counted (their events go out after the step's snapshot) and before `load` returns;
        // the idle pool then follows within a period or two. Take it when it comes.
        if let Ok(frame) = tokio::time::timeout(Duration::from_secs(1), self.next()).await {
            last = frame;
            on_frame(&last);
        }
        last
    }
}

/// `base`'s /metrics page.
async fn metrics_text(base: &str) -> String {
    get_text(base, "/metrics").await
}

/// The pool as the page rebuilds it.
#[derive(Default)]
struct Pool(Vec<u8>);

impl Pool {
    /// Applies a snapshot's pool and checks it against the snapshot's counts and sequences.
    fn apply_and_check(&mut self, s: &Value) {
        self.apply_part(s, s, "blocks");
    }

    /// Applies `part`'s pool (the snapshot itself, or its `window` group: `pool`, `counts`,
    /// `num_blocks`) and checks it against its counts and the sequences' tables `table` of the
    /// snapshot `s` (0 in a table: a released window entry, held by no one).
    fn apply_part(&mut self, part: &Value, s: &Value, table: &str) {
        let pool = &part["pool"];
        if let Some(full) = pool["full"].as_str() {
            self.0 = full.bytes().map(|b| b - b'0').collect();
        } else {
            for run in pool["runs"].as_array().unwrap() {
                let start = run[0].as_u64().unwrap() as usize;
                for (i, b) in run[1].as_str().unwrap().bytes().enumerate() {
                    self.0[start + i] = b - b'0';
                }
            }
        }
        let n = part["num_blocks"].as_u64().unwrap() as usize;
        assert_eq!(self.0.len(), n);
        let mut counts = [0u64; 4];
        for &b in &self.0 {
            counts[usize::from(b)] += 1;
        }
        let c = &part["counts"];
        let want = ["free", "used", "cached", "shared"].map(|k| c[k].as_u64().unwrap());
        assert_eq!(counts, want, "rebuilt pool against the snapshot's counts");
        assert_eq!(counts.iter().sum::<u64>() as usize, n);
        // Ref counts from the running sequences' tables (block ids count from 1; the pool's
        // index from 0).
        let mut refs: HashMap<usize, u32> = HashMap::new();
        for q in s["seqs"].as_array().unwrap() {
            let blocks = q[table].as_array().unwrap();
            if !q["running"].as_bool().unwrap() {
                assert!(blocks.is_empty(), "a waiting sequence holds blocks: {q}");
            }
            for b in blocks.iter().map(|b| b.as_u64().unwrap() as usize) {
                if b != 0 {
                    *refs.entry(b).or_default() += 1;
                }
            }
        }
        for (i, &state) in self.0.iter().enumerate() {
            let want = match refs.get(&(i + 1)) {
                None => [0, 2].contains(&state),
                Some(1) => state == 1,
                Some(_) => state == 3,
            };
            assert!(
                want,
                "block {}: state {state}, held {:?} times",
                i + 1,
                refs.get(&(i + 1))
            );
        }
    }

    fn used(&self) -> usize {
        self.0.iter().filter(|&&b| b == 1 || b == 3).count()
    }
}

/// The value of a metric line `name{...} v` in a /metrics text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_follow_the_page_table_and_agree_with_metrics() {
    let (base, _) = start(vec![]).await;
    let page = reqwest::get(format!("{base}/dashboard")).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = page.text().await.unwrap();
    assert!(html.contains("pagewise · page table") && html.contains("EventSource"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "the page fetches nothing from elsewhere"
    );

    let mut events = Events::open(&format!("{base}/dashboard/events"), None).await;
    let mut pool = Pool::default();
    // An idle engine publishes its pool as soon as a viewer asks.
    let first = events.next().await;
    assert!(
        first["pool"]["full"].is_string(),
        "the first event carries the whole pool"
    );
    pool.apply_and_check(&first);
    assert_eq!(pool.used(), 0);

    // A load: 12 requests sharing a prefix (prefix-cache hits), a little apart.
    let prefix = "The page table hands out blocks. ".repeat(2);
    let load = tokio::spawn({
        let base = base.clone();
        async move {
            let mut tasks = Vec::new();
            for i in 0..12 {
                let (base, prompt) = (base.clone(), format!("{prefix} request {i}"));
                tasks.push(tokio::spawn(async move {
                    post(&base, "/v1/completions", json!({"prompt": prompt, "max_tokens": 120, "ignore_eos": true, "temperature": 0})).await
                }));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for t in tasks {
                assert_eq!(t.await.unwrap().0, 200);
            }
        }
    });
    let (mut busiest, mut deltas) = (0, 0);
    let last = events
        .follow(first, load, |s| {
            pool.apply_and_check(s);
            deltas += usize::from(s["pool"]["runs"].is_array());
            busiest = busiest.max(s["seqs"].as_array().unwrap().len());
        })
        .await;
    assert!(
        busiest >= 2,
        "the snapshots saw the load: at most {busiest} sequences at once"
    );
    assert!(
        deltas > 0,
        "later snapshots send the changed runs, not the whole pool"
    );
    assert_eq!(pool.used(), 0, "every block is freed at the end");
    assert!(
        pool.0.contains(&2),
        "finished prompts leave cached prefix blocks"
    );

    // The idle snapshot against /metrics (read after it: the counters no longer move).
    let text = metrics_text(&base).await;
    let st = &last["stats"];
    assert_eq!(st["running"], 0);
    assert_eq!(metric(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(
        metric(&text, "vllm:kv_cache_usage_perc"),
        st["kv_usage"].as_f64().unwrap()
    );
    for (name, field) in [
        ("vllm:generation_tokens_total", "generated_tokens"),
        ("vllm:prefix_cache_queries_total", "prefix_queries"),
        ("vllm:prefix_cache_hits_total", "prefix_hits"),
        ("pagewise:engine_steps_total", "steps"),
    ] {
        assert_eq!(metric(&text, name), st[field].as_f64().unwrap(), "{name}");
    }
    assert_eq!(st["generated_tokens"], 12 * 120);
    assert!(st["prefix_hits"].as_u64().unwrap() > 0, "{st}");
}

/// The tiny Gemma 3 (a 5-token window on two of its three layers) with a window group: every
/// snapshot's window pool agrees with its counts and with the sequences' window tables, a long
/// generation keeps at most the blocks its window reaches there while its full table grows, and
/// the idle snapshot's window usage is what `/metrics` reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_group_is_shown_and_follows_the_window_tables() {
    let args = pagewise::EngineArgs {
        model: concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemma3").into(),
        block_size: 8,
        max_num_seqs: 4,
        max_num_batched_tokens: Some(16),
        // 40 blocks of 8 tokens (2 KV heads x 32 dims x K,V x f32) per layer when alike.
        kv_cache_memory: Some(3 * 40 * 8 * 2 * 32 * 2 * 4),
        max_model_len: Some(256),
        chat_template: Some(CHATML.into()),
        ..Default::default()
    };
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        ..Default::default()
    };
    let (base, _) = serve(args, opts).await;
    let mut events = Events::open(&format!("{base}/dashboard/events"), None).await;
    let (mut pool, mut window) = (Pool::default(), Pool::default());
    let first = events.next().await;
    assert_eq!(first["window"]["window"], 5, "{}", first["window"]);
    assert_eq!(
        first["window"]["num_blocks"], 14,
        "15 blocks less the null one"
    );
    pool.apply_and_check(&first);
    window.apply_part(&first["window"], &first, "window_blocks");

    let load = tokio::spawn({
        let base = base.clone();
        async move {
            let mut tasks = Vec::new();
            for i in 0..3 {
                let base = base.clone();
                // Long enough that snapshots a period apart see the tables late in the run
                // however fast the steps are: 3 x 29 blocks fit the 89 of the full group.
                let body = json!({"prompt": [1 + i, 2, 3, 4, 5, 6, 7, 8, 9, 10], "max_tokens": 220,
                    "ignore_eos": true, "temperature": 0});
                tasks.push(tokio::spawn(async move {
                    post(&base, "/v1/completions", body).await
                }));
            }
            for t in tasks {
                let (status, body) = t.await.unwrap();
                assert_eq!(status, 200, "{body}");
            }
        }
    });
    let (mut most_window, mut most_full, mut released) = (0, 0, 0);
    let last = events
        .follow(first, load, |s| {
            pool.apply_and_check(s);
            window.apply_part(&s["window"], s, "window_blocks");
            for q in s["seqs"].as_array().unwrap() {
                let table = q["window_blocks"].as_array().unwrap();
                let live = table.iter().filter(|b| b.as_u64() != Some(0)).count();
                assert_eq!(table.len(), q["blocks"].as_array().unwrap().len(), "{q}");
                most_window = most_window.max(live);
                most_full = most_full.max(table.len());
                released = released.max(table.len() - live);
            }
        })
        .await;
    eprintln!(
        "full tables up to {most_full} blocks, window up to {most_window}, released {released}"
    );
    // 230 tokens fill 29 blocks; a 5-token window reaches at most 2 of them, and one more is
    // taken before the step that leaves the oldest behind releases it.
    assert!(
        most_full >= 15,
        "the full tables grew to {most_full} blocks"
    );
    assert!(
        (1..=3).contains(&most_window),
        "window tables held up to {most_window} blocks"
    );
    assert!(released >= 10, "entries released: {released}");
    assert_eq!(window.used(), 0, "every window block is freed at the end");

    let text = metrics_text(&base).await;
    assert_eq!(
        metric(&text, "pagewise:kv_window_cache_usage_perc"),
        last["stats"]["kv_window_usage"].as_f64().unwrap()
    );
    assert_eq!(last["stats"]["kv_window_usage"], 0.0);
}

/// Requests that come and go faster than the refresh period: snapshots stay at least a period
/// apart (the engine going idle between two requests does not publish at once, which would
/// replace the busy snapshot before a viewer reads it), some show the load, and the idle pool
/// still comes once the load is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brief_idle_gaps_do_not_crowd_out_busy_snapshots() {
    let (base, _) = start(vec![]).await;
    let mut events = Events::open(&format!("{base}/dashboard/events"), None).await;
    let first = events.next().await;
    let load = tokio::spawn({
        let base = base.clone();
        async move {
            let until = tokio::time::Instant::now() + Duration::from_millis(1500);
            while tokio::time::Instant::now() < until {
                let body = json!({"prompt": "a b c", "max_tokens": 4, "ignore_eos": true});
                assert_eq!(post(&base, "/v1/completions", body).await.0, 200);
            }
        }
    });
    let mut times = vec![first["t"].as_f64().unwrap()];
    let mut busy = 0;
    let last = events
        .follow(first, load, |s| {
            times.push(s["t"].as_f64().unwrap());
            busy += usize::from(!s["seqs"].as_array().unwrap().is_empty());
        })
        .await;
    assert_eq!(last["stats"]["running"], 0, "the idle pool is published");
    let closest = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(f64::INFINITY, f64::min);
    assert!(
        closest >= 0.099,
        "two snapshots {closest:.3} s apart: {times:?}"
    );
    assert!(busy > 0, "no snapshot showed a request running: {times:?}");
}

/// An open viewer does not hold a shutdown up: on SIGTERM its stream ends and the server returns
/// (graceful shutdown waits for every connection; the stream would otherwise never end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_viewer_does_not_hold_up_a_shutdown() {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = stop_rx.await;
    };
    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        ..Default::default()
    };
    let (base, _, server) = serve_until(engine_args(), opts, stop, Duration::from_secs(5)).await;
    let mut events = Events::open(&format!("{base}/dashboard/events"), None).await;
    events.next().await;
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server did not stop while a viewer watched")
        .unwrap()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = events.body.next().await {}
    })
    .await
    .expect("the viewer's stream did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_sits_behind_the_api_key_and_can_be_turned_off() {
    let (base, _) = start(vec!["sesame".into()]).await;
    for path in ["/dashboard", "/dashboard/events", "/dashboard?key=wrong"] {
        let r = reqwest::get(format!("{base}{path}")).await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
    }
    let r = reqwest::get(format!("{base}/dashboard?key=sesame"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut events = Events::open(&format!("{base}/dashboard/events"), Some("sesame")).await;
    let mut pool = Pool::default();
    pool.apply_and_check(&events.next().await);
    drop(events);
    let r = reqwest::get(format!("{base}/dashboard/events?key=sesame"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let opts = ServerOptions {
        served_model_names: vec!["tiny".into()],
        disable_dashboard: true,
        ..Default::default()
    };
    let (base, _) = serve(engine_args(), opts).await;
    for path in ["/dashboard", "/dashboard/events"] {
        let r = reqwest::get(format!("{base}{path}")).await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
}
