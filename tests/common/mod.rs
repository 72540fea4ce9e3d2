pub mod fake_model;

/// Path of the SmolLM2-135M-Instruct GGUF: `$PAGEWISE_SMOLLM2_GGUF`, else the cache that
/// `scripts/fetch_smollm2.py` fills. `None` (test skipped) only outside CI.
#[allow(dead_code)]
pub fn smollm2_gguf() -> Option<String> {
    let path = std::env::var("PAGEWISE_SMOLLM2_GGUF").ok().or_else(|| {
        let home = std::env::var("HOME").ok()?;
        let p = format!("{home}/.cache/pagewise/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        std::path::Path::new(&p).is_file().then_some(p)
    });
    if path.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must provide SmolLM2 (scripts/fetch_smollm2.py); set PAGEWISE_SMOLLM2_GGUF"
        );
        eprintln!("SmolLM2 GGUF not found: run scripts/fetch_smollm2.py; skipping");
    }
    path
}
