//! Models named by Hugging Face repo id (`org/name`): resolved to a snapshot directory in the local
//! Hugging Face cache, downloading what is missing unless `HF_HUB_OFFLINE=1`.
//!
//! The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub` (the layout
//! `huggingface_hub` writes, so models it downloaded are found). `HF_TOKEN` authenticates downloads.

use std::path::{Path, PathBuf};

use hf_hub::Cache;
use hf_hub::api::sync::ApiBuilder;

use super::LoadError;

/// Files a model directory needs, and those it may have.
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
const OPTIONAL: [&str; 2] = ["tokenizer_config.json", "generation_config.json"];
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

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
    id: String,
}

impl Fetch for Online {
    fn fetch(&self, file: &str) -> Result<Option<PathBuf>, LoadError> {
        match self.repo.get(file) {
            Ok(path) => Ok(Some(path)),
            // A 404 is an absent optional file; anything else (network, auth) is an error.
            Err(hf_hub::api::sync::ApiError::RequestError(e))
                if matches!(*e, ureq::Error::Status(404, _)) =>
            {
                Ok(None)
            }
            Err(e) => Err(LoadError::NotFound(format!(
                "downloading {file} of {} from the Hugging Face hub failed: {e}",
                self.id
            ))),
        }
    }
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
        let api = ApiBuilder::from_cache(cache.clone())
            .with_token(std::env::var("HF_TOKEN").ok().or_else(|| cache.token()))
            .with_progress(false)
            .build()
            .map_err(|e| LoadError::NotFound(format!("Hugging Face hub client: {e}")))?;
        Box::new(Online {
            repo: api.model(repo_id.to_string()),
            id: repo_id.to_string(),
        })
    };
    let missing = |file: &str| {
        let how = if offline {
            format!(
                "HF_HUB_OFFLINE is set and it is not in the Hugging Face cache at {}",
                cache.path().display()
            )
        } else {
            "the repository has no such file".to_string()
        };
        LoadError::NotFound(format!("{repo_id}: {file} is missing ({how})"))
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
