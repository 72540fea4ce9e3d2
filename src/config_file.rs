//! `--config FILE` (TOML or YAML): the same keys as the command-line flags. Precedence is
//! command line > environment (`PAGEWISE_*`) > config file > defaults: every key of the file that no
//! environment variable already sets becomes that variable before the command line is parsed. A
//! key that no flag reads (a typo, or a vLLM setting pagewise does not have) is refused by name.

use std::path::Path;

/// Why a config file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("config file {path}: {message}")]
pub struct ConfigError {
    /// The file.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// The `--config` path in `args`, if any (`--config PATH` or `--config=PATH`).
pub fn config_path(args: &[String]) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            return it.next().cloned();
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(p.to_string());
        }
    }
    None
}

/// The `(PAGEWISE_* variable, value)` pairs a config file sets. `known` says whether a flag reads
/// a variable; a key whose variable none reads is an error naming it.
pub fn read(
    path: &str,
    known: impl Fn(&str) -> bool,
) -> Result<Vec<(String, String)>, ConfigError> {
    let err = |message: String| ConfigError {
        path: path.to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let is_yaml = Path::new(path)
        .extension()
        .is_some_and(|e| e == "yaml" || e == "yml");
    let value: serde_json::Value = if is_yaml {
        serde_yaml::from_str(&text).map_err(|e| err(e.to_string()))?
    } else {
        toml::from_str(&text).map_err(|e| err(e.to_string()))?
    };
    let map = value
        .as_object()
        .ok_or_else(|| err("the top level must be a table of flag names".into()))?;
    map.iter()
        .map(|(key, v)| {
            let var = format!("PAGEWISE_{}", key.to_uppercase().replace('-', "_"));
            if !known(&var) {
                return Err(err(format!(
                    "`{key}` is not a setting a config file can give (no flag reads {var}); \
                     `pagewise <command> --help` lists the flags and their variables"
                )));
            }
            let scalar = |v: &serde_json::Value| match v {
                serde_json::Value::String(s) => Ok(s.clone()),
                serde_json::Value::Number(_) | serde_json::Value::Bool(_) => Ok(v.to_string()),
                other => Err(err(format!("`{key}` has an unsupported value {other}"))),
            };
            let value = match v {
                serde_json::Value::Array(items) => items
                    .iter()
                    .map(scalar)
                    .collect::<Result<Vec<_>, _>>()?
                    .join(","),
                other => scalar(other)?,
            };
            Ok((var, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_yaml_become_pagewise_variables() {
        let dir = std::env::temp_dir().join(format!("pagewise-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let toml = dir.join("c.toml");
        std::fs::write(&toml, "port = 9000\nmax-num-seqs = 8\napi_key = [\"a\", \"b\"]\nenable-prefix-caching = false\n").unwrap();
        let known = |v: &str| v != "PAGEWISE_SWAP_SPACE";
        let mut vars = read(toml.to_str().unwrap(), known).unwrap();
        vars.sort();
        assert_eq!(
            vars,
            vec![
                ("PAGEWISE_API_KEY".to_string(), "a,b".to_string()),
                (
                    "PAGEWISE_ENABLE_PREFIX_CACHING".to_string(),
                    "false".to_string()
                ),
                ("PAGEWISE_MAX_NUM_SEQS".to_string(), "8".to_string()),
                ("PAGEWISE_PORT".to_string(), "9000".to_string()),
            ]
        );
        let yaml = dir.join("c.yaml");
        std::fs::write(&yaml, "host: 127.0.0.1\nserved-model-name: [x, y]\n").unwrap();
        let vars = read(yaml.to_str().unwrap(), known).unwrap();
        assert!(vars.contains(&("PAGEWISE_SERVED_MODEL_NAME".into(), "x,y".into())));
        std::fs::write(&yaml, "- just\n- a list\n").unwrap();
        assert!(read(yaml.to_str().unwrap(), known).is_err());
        std::fs::write(&yaml, "host: 127.0.0.1\nswap-space: 4\n").unwrap();
        let refused = read(yaml.to_str().unwrap(), known).unwrap_err().to_string();
        assert!(
            refused.contains("`swap-space` is not a setting"),
            "{refused}"
        );
        assert!(refused.contains("PAGEWISE_SWAP_SPACE"), "{refused}");
        assert_eq!(
            config_path(&["serve".into(), "--config".into(), "f.toml".into()]).as_deref(),
            Some("f.toml")
        );
        assert_eq!(
            config_path(&["--config=g.yaml".into()]).as_deref(),
            Some("g.yaml")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
