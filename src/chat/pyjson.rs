//! The `tojson` filter as transformers defines it: Python's `json.dumps(x, ensure_ascii=False,
//! indent=None, separators=None, sort_keys=False)`, every option taken as a keyword.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};

/// The `json.dumps` options a template may pass.
struct Options {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// A JSON string literal as Python writes it: `\uXXXX` for control characters and, with
/// `ensure_ascii`, for everything outside ASCII (astral characters as surrogate pairs).
fn py_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write(v: &serde_json::Value, o: &Options, level: usize, out: &mut String) {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = o.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    match v {
        serde_json::Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, level + 1);
                write(item, o, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        serde_json::Value::Object(map) if !map.is_empty() => {
            let mut entries: Vec<_> = map.iter().collect();
            if o.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, level + 1);
                py_string(k, o.ensure_ascii, out);
                out.push_str(&o.key_sep);
                write(item, o, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        serde_json::Value::String(s) => py_string(s, o.ensure_ascii, out),
        other => out.push_str(&other.to_string()),
    }
}

/// `x | tojson(...)`.
pub fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    // Python's defaults: ", " between items without an indent, "," with one; ": " after keys.
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be an (item, key) pair",
            ));
        }
        None => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let options = Options {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write(&json, &options, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;
    use serde_json::json;

    fn render(expr: &str, x: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        env.render_str(
            expr,
            minijinja::context! { x => minijinja::value::Value::from(minijinja::value::Serde(x)) },
        )
        .unwrap()
    }

    #[test]
    fn writes_what_python_json_dumps_writes() {
        let x = json!({"b": [1, 2.5, "é\u{1}\n"], "a": {}, "c": []});
        assert_eq!(
            render("{{ x | tojson }}", x.clone()),
            r#"{"b": [1, 2.5, "é\u0001\n"], "a": {}, "c": []}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=1) }}", x.clone()),
            "{\n \"b\": [\n  1,\n  2.5,\n  \"é\\u0001\\n\"\n ],\n \"a\": {},\n \"c\": []\n}"
        );
        assert_eq!(
            render(
                "{{ x | tojson(separators=(',', ':'), sort_keys=true, ensure_ascii=true) }}",
                json!({"z": "🌍", "a": "ü"})
            ),
            r#"{"a":"\u00fc","z":"\ud83c\udf0d"}"#
        );
    }
}
