//! Models named by Hugging Face repo id (`org/name`): resolved to a snapshot directory in the local
//! Hugging Face cache, downloading what is missing unless `HF_HUB_OFFLINE=1`.
//!
//! The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub` (the layout
//! `huggingface_hub` writes, so models it downloaded are found). `HF_TOKEN` authenticates downloads.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hf_hub::Cache;
use hf_hub::api::sync::ApiBuilder;

use super::LoadError;
use crate::model::checkpoint::Tenths;

/// Files a model directory needs, and those it may have.
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
const OPTIONAL: [&str; 2] = ["tokenizer_config.json", "generation_config.json"];
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";
/// Downloads from this size on log a line at each tenth when stderr is not a terminal.
const LOGGED_FROM: usize = 64 << 20;

/// Whether `name` looks like a hub repo id rather than a local path.
pub fn is_repo_id(name: &str) -> bool {
    let mut parts = name.split('/');
    let (Some(org), Some(repo), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    ok(org) && ok(repo)
}

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(home) = std::env::var_os("HF_HOME") {
        return PathBuf::from(home).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("huggingface").join("hub")
}

fn is_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "TRUE" | "yes" | "ON" | "on"))
}

/// Fetches (or finds) one file of the repo.
trait Fetch {
    fn fetch(&self, file: &str) -> Result<Option<PathBuf>, LoadError>;
}

struct Offline {
    repo: hf_hub::CacheRepo,
}

impl Fetch for Offline {
    fn fetch(&self, file: &str) -> Result<Option<PathBuf>, LoadError> {
        Ok(self.repo.get(file))
    }
}

struct Online {
    repo: hf_hub::api::sync::ApiRepo,
    /// The same repository in the local cache (what needs no download).
    cached: hf_hub::CacheRepo,
    id: String,
    endpoint: String,
    /// A progress bar per download (stderr is a terminal); else one log line per file.
    progress: bool,
}

impl Fetch for Online {
    fn fetch(&self, file: &str) -> Result<Option<PathBuf>, LoadError> {
        use hf_hub::api::sync::ApiError;
        let id = &self.id;
        let got = if self.progress || self.cached.get(file).is_some() {
            self.repo.get(file)
        } else {
            tracing::info!("downloading {file} of {id} from {}", self.endpoint);
            let what = format!("downloading {file} of {id}");
            self.repo
                .download_with_progress(file, LogLines { what, tenths: None })
        };
        match got {
            Ok(path) => Ok(Some(path)),
            // A 404 is an absent optional file (config.json's absence is told apart by the
            // caller); anything else (network, auth) is an error.
            Err(ApiError::RequestError(e)) if matches!(*e, ureq::Error::Status(404, _)) => Ok(None),
            // The hub answers 401 for a repository that does not exist as for a private one.
            Err(ApiError::RequestError(e)) if matches!(*e, ureq::Error::Status(401 | 403, _)) => {
                Err(LoadError::NotFound(format!(
                    "no model {id:?} on the Hugging Face hub, or it needs access: check the \
                     name (org/name); for a gated or private model, set HF_TOKEN"
                )))
            }
            Err(ApiError::RequestError(e)) if matches!(*e, ureq::Error::Transport(_)) => {
                Err(LoadError::NotFound(format!(
                    "cannot reach the Hugging Face hub ({}) to download {id}: {e}; check the \
                     network, or set HF_HUB_OFFLINE=1 to use only the models in the local cache",
                    self.endpoint
                )))
            }
            Err(e) => Err(LoadError::NotFound(format!(
                "downloading {file} of {id} from the Hugging Face hub failed: {e}"
            ))),
        }
    }
}

/// A download's progress as a log line at each tenth (files of at least [`LOGGED_FROM`] bytes).
struct LogLines {
    what: String,
    tenths: Option<Tenths>,
}

impl hf_hub::api::Progress for LogLines {
    fn init(&mut self, size: usize, _: &str) {
        // (Called again when the download resumes: the count goes on.)
        if self.tenths.is_none() && size >= LOGGED_FROM {
            self.tenths = Some(Tenths::new(self.what.clone(), size as u64, Instant::now()));
        }
    }

    fn update(&mut self, size: usize) {
        let Some(tenths) = self.tenths.as_mut() else {
            return;
        };
        if let Some(line) = tenths.add(size as u64, Instant::now()) {
            tracing::info!("{line}");
        }
    }

    fn finish(&mut self) {}
}

/// The local snapshot directory holding `repo_id`'s model files.
pub fn resolve(repo_id: &str) -> Result<PathBuf, LoadError> {
    let cache = Cache::new(cache_dir());
    let offline = is_offline();
    let fetcher: Box<dyn Fetch> = if offline {
        Box::new(Offline {
            repo: cache.model(repo_id.to_string()),
        })
    } else {
        let endpoint =
            std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
        let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let api = ApiBuilder::from_cache(cache.clone())
            .with_endpoint(endpoint.clone())
            .with_token(std::env::var("HF_TOKEN").ok().or_else(|| cache.token()))
            .with_progress(progress)
            .build()
            .map_err(|e| LoadError::NotFound(format!("Hugging Face hub client: {e}")))?;
        Box::new(Online {
            repo: api.model(repo_id.to_string()),
            cached: cache.model(repo_id.to_string()),
            id: repo_id.to_string(),
            endpoint,
            progress,
        })
    };
    let missing = |file: &str| {
        LoadError::NotFound(match (offline, file) {
            (true, _) => format!(
                "{repo_id}: {file} is not in the Hugging Face cache at {} and HF_HUB_OFFLINE \
                 is set: unset HF_HUB_OFFLINE to download it, or pass a local path",
                cache.path().display()
            ),
            (false, "config.json") => format!(
                "no model {repo_id:?} on the Hugging Face hub (it has no config.json): check \
                 the name (org/name); a GGUF repository needs the path of its .gguf file"
            ),
            (false, _) => format!("{repo_id}: the repository has no {file}"),
        })
    };
    let mut dir: Option<PathBuf> = None;
    for file in REQUIRED {
        let path = fetcher.fetch(file)?.ok_or_else(|| missing(file))?;
        dir.get_or_insert_with(|| parent(&path));
    }
    for file in OPTIONAL {
        fetcher.fetch(file)?;
    }
    match fetcher.fetch(INDEX)? {
        Some(index) => {
            let text = std::fs::read_to_string(&index)
                .map_err(|e| LoadError::Io(format!("{}: {e}", index.display())))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| LoadError::Format(format!("{INDEX}: {e}")))?;
            let mut shards: Vec<&str> = v["weight_map"]
                .as_object()
                .map(|m| m.values().filter_map(|s| s.as_str()).collect())
                .unwrap_or_default();
            shards.sort_unstable();
            shards.dedup();
            for shard in shards {
                fetcher.fetch(shard)?.ok_or_else(|| missing(shard))?;
            }
        }
        None => {
            fetcher.fetch(SINGLE)?.ok_or_else(|| missing(SINGLE))?;
        }
    }
    Ok(dir.expect("config.json resolved"))
}

fn parent(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_and_paths_are_told_apart() {
        assert!(is_repo_id("facebook/opt-125m"));
        assert!(is_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(!is_repo_id("./models/x"));
        assert!(!is_repo_id("/abs/path"));
        assert!(!is_repo_id("a/b/c"));
        assert!(!is_repo_id("model.gguf"));
    }
}
