//! The real chat templates of the families pagewise serves render as transformers renders them.
//!
//! The templates come from scripts/fetch_chat_templates.py (a pinned PyPI sdist; set
//! PAGEWISE_CHAT_TEMPLATES to its output, or leave them in ~/.cache/pagewise/chat-templates);
//! tests/fixtures/chat-templates.json holds what transformers rendered for each conversation
//! (tests/fixtures/make_chat_templates.py). Where transformers raised, pagewise must refuse too,
//! with the template's own message when the template raised it.

use pagewise::chat::ChatTemplate;
use serde_json::Value;

/// 2026-03-07 12:00:00 UTC, the clock the fixture was rendered at.
const FIXTURE_TIME: i64 = 1_772_884_800;

fn template_dir() -> Option<std::path::PathBuf> {
    let dir = std::env::var("PAGEWISE_CHAT_TEMPLATES")
        .ok()
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let home = std::env::var("HOME").ok()?;
            Some(std::path::Path::new(&home).join(".cache/pagewise/chat-templates"))
        })
        .filter(|d| d.is_dir());
    if dir.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must provide the chat templates (scripts/fetch_chat_templates.py); set PAGEWISE_CHAT_TEMPLATES"
        );
        eprintln!("chat templates not found: run scripts/fetch_chat_templates.py; skipping");
    }
    dir
}

#[test]
fn real_templates_render_as_transformers_renders_them() {
    let Some(dir) = template_dir() else { return };
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/chat-templates.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    let templates = fixture["templates"].as_object().unwrap();
    let (mut rendered, mut refused, mut failures) = (0, 0, Vec::new());
    for (name, t) in templates {
        let source = std::fs::read_to_string(dir.join(format!("{name}.jinja")))
            .unwrap_or_else(|e| panic!("{name}.jinja: {e}"));
        let template = ChatTemplate::new(
            &source,
            t["bos_token"].as_str().unwrap(),
            t["eos_token"].as_str().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .with_fixed_time(FIXTURE_TIME);
        for case in cases {
            let case_name = case["name"].as_str().unwrap();
            let mut extra = case["kwargs"].as_object().cloned().unwrap_or_default();
            if let Some(tools) = case.get("tools") {
                extra.insert("tools".into(), tools.clone());
            }
            let add_generation_prompt = case["add_generation_prompt"].as_bool().unwrap_or(true);
            let got = template.render(&case["messages"], add_generation_prompt, &extra);
            let want = &t["results"][case_name];
            let label = format!("{name} / {case_name}");
            match (got, want.get("rendered")) {
                (Ok(got), Some(want)) if got == want.as_str().unwrap() => rendered += 1,
                (Ok(got), Some(want)) => failures.push(format!(
                    "{label}: rendered differently\n--- pagewise\n{got}\n--- transformers\n{}",
                    want.as_str().unwrap()
                )),
                (Ok(got), None) => failures.push(format!(
                    "{label}: transformers refused ({}), pagewise rendered\n{got}",
                    want["error"]
                )),
                (Err(e), Some(_)) => failures.push(format!("{label}: pagewise refused: {e}")),
                (Err(e), None) if e.0 == want["error"].as_str().unwrap() => refused += 1,
                (Err(e), None) => failures.push(format!(
                    "{label}: refused with another message: {} (transformers: {})",
                    e.0, want["error"]
                )),
            }
        }
    }
    eprintln!(
        "{} templates x {} conversations: {rendered} rendered alike, {refused} refused alike",
        templates.len(),
        cases.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        rendered >= 100 && refused >= 5,
        "the fixture lost its cases"
    );
}
