//! Which properties a JSON schema's objects may hold beyond those they name.
//!
//! JSON Schema says an object schema without `additionalProperties` accepts any other property,
//! and llguidance follows it to the letter: on a small model that means invented keys and
//! rambling inside them until `max_tokens`. OpenAI's structured outputs and vLLM's default
//! backend (xgrammar) generate only the named properties. So do we: [`close_objects`] writes
//! `additionalProperties: false` into every object schema that names properties and does not
//! say, before the schema is compiled. The engine's
//! `structured_outputs_allow_additional_properties` turns that off (JSON Schema's reading, as
//! vLLM's guidance backend without `disable_additional_properties`); a schema sent with
//! `strict: true` is closed whatever that setting says, and [`check_strict`] refuses one that
//! opens an object explicitly.
//!
//! The walk knows which keywords hold schemas, so data (`const`, `enum`, `default`, `examples`)
//! and property maps are never mistaken for schemas. The branches of an `allOf`, and a schema
//! that has one, are left open: their properties combine, and closing each part alone would
//! forbid the others' properties.

use serde_json::{Map, Value};

/// Keywords whose value is one schema.
const ONE_SCHEMA: &[&str] = &[
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
];

/// Keywords whose value is a list of schemas.
const SCHEMA_LISTS: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems", "items"];

/// Keywords whose value maps names to schemas.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// `schema` with `additionalProperties: false` in every object schema that names properties
/// (`properties` or `patternProperties`) and sets neither `additionalProperties` nor
/// `unevaluatedProperties`.
pub fn close_objects(schema: &Value) -> Value {
    let mut schema = schema.clone();
    walk(&mut schema, true, &mut |s, closable| {
        if closable
            && (s.contains_key("properties") || s.contains_key("patternProperties"))
            && !s.contains_key("additionalProperties")
            && !s.contains_key("unevaluatedProperties")
        {
            s.insert("additionalProperties".into(), Value::Bool(false));
        }
    });
    schema
}

/// Under `strict: true` every object holds only its named properties: a schema that allows
/// others explicitly (`additionalProperties` or `unevaluatedProperties` other than `false`) is
/// refused, with the path of the first one.
pub fn check_strict(schema: &Value) -> Result<(), String> {
    let mut found: Option<(String, &'static str)> = None;
    find_open(schema, "#", &mut found);
    match found {
        None => Ok(()),
        Some((path, key)) => Err(format!(
            "a strict schema allows only the properties it names, but {path} sets `{key}` to \
             something other than false. Remove it, or send the schema without `strict: true`."
        )),
    }
}

/// Calls `f` on every schema object inside `schema` (children first), with whether closing it is
/// allowed (not an `allOf` branch, not holding an `allOf`).
fn walk(schema: &mut Value, closable: bool, f: &mut dyn FnMut(&mut Map<String, Value>, bool)) {
    let Value::Object(map) = schema else {
        return;
    };
    for (key, value) in map.iter_mut() {
        let key = key.as_str();
        if ONE_SCHEMA.contains(&key) && value.is_object() {
            walk(value, true, f);
        } else if SCHEMA_LISTS.contains(&key)
            && let Value::Array(list) = value
        {
            for item in list {
                walk(item, key != "allOf", f);
            }
        } else if SCHEMA_MAPS.contains(&key)
            && let Value::Object(children) = value
        {
            for child in children.values_mut() {
                walk(child, true, f);
            }
        }
    }
    let closable = closable && !map.contains_key("allOf");
    f(map, closable);
}

/// The first place in `schema` that opens an object explicitly, by its JSON-pointer path.
fn find_open(schema: &Value, path: &str, found: &mut Option<(String, &'static str)>) {
    let Value::Object(map) = schema else {
        return;
    };
    for key in ["additionalProperties", "unevaluatedProperties"] {
        if found.is_none()
            && let Some(v) = map.get(key)
            && v != &Value::Bool(false)
        {
            *found = Some((path.to_string(), key));
        }
    }
    for (key, value) in map {
        if found.is_some() {
            return;
        }
        let k = key.as_str();
        if ONE_SCHEMA.contains(&k) {
            find_open(value, &format!("{path}/{key}"), found);
        } else if SCHEMA_LISTS.contains(&k)
            && let Value::Array(list) = value
        {
            for (i, item) in list.iter().enumerate() {
                find_open(item, &format!("{path}/{key}/{i}"), found);
            }
        } else if SCHEMA_MAPS.contains(&k)
            && let Value::Object(children) = value
        {
            for (name, child) in children {
                find_open(child, &format!("{path}/{key}/{name}"), found);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_that_name_properties_are_closed_everywhere_schemas_live() {
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
                "list": {"type": "array", "items": {"properties": {"y": {}}}},
                "either": {"anyOf": [{"properties": {"a": {}}}, {"type": "null"}]}
            },
            "$defs": {"point": {"properties": {"x": {}}}},
            "const_like": {"properties": {"not": "a schema"}},
            "examples": [{"properties": {}}]
        });
        let closed = close_objects(&schema);
        assert_eq!(closed["additionalProperties"], false);
        let p = &closed["properties"];
        // A property called "properties" is a property, not a keyword of the map.
        assert!(p.get("additionalProperties").is_none(), "{closed}");
        assert_eq!(p["properties"]["additionalProperties"], false);
        assert!(p["city"].get("additionalProperties").is_none());
        assert_eq!(p["list"]["items"]["additionalProperties"], false);
        assert_eq!(p["either"]["anyOf"][0]["additionalProperties"], false);
        assert_eq!(closed["$defs"]["point"]["additionalProperties"], false);
        // Data and unknown keywords are left alone.
        assert_eq!(closed["examples"], schema["examples"]);
        assert_eq!(closed["const_like"], schema["const_like"]);
    }

    #[test]
    fn what_the_schema_says_stays_and_all_of_stays_open() {
        let schema = json!({
            "anyOf": [
                {"properties": {"a": {}}, "additionalProperties": true},
                {"properties": {"b": {}}, "additionalProperties": {"type": "integer"}},
                {"properties": {"c": {}}, "unevaluatedProperties": false},
                {"allOf": [{"properties": {"d": {}}}, {"properties": {"e": {}}}],
                 "properties": {"f": {}}}
            ]
        });
        let closed = close_objects(&schema);
        assert_eq!(closed["anyOf"][0]["additionalProperties"], true);
        assert_eq!(
            closed["anyOf"][1]["additionalProperties"],
            json!({"type": "integer"})
        );
        assert!(closed["anyOf"][2].get("additionalProperties").is_none());
        let all = &closed["anyOf"][3];
        assert!(all.get("additionalProperties").is_none(), "{closed}");
        assert!(all["allOf"][0].get("additionalProperties").is_none());
        // `{"type": "object"}` names nothing: any object, as json_object.
        let any = json!({"type": "object"});
        assert_eq!(close_objects(&any), any);
    }

    #[test]
    fn strict_refuses_objects_opened_explicitly() {
        let ok = json!({"type": "object", "properties": {"a": {"type": "object",
            "properties": {}, "additionalProperties": false}}});
        assert!(check_strict(&ok).is_ok());
        let open = json!({"type": "object", "properties": {"a": {"type": "object",
            "additionalProperties": {"type": "string"}}}});
        let e = check_strict(&open).unwrap_err();
        assert!(
            e.contains("#/properties/a") && e.contains("additionalProperties"),
            "{e}"
        );
        let top = json!({"properties": {}, "additionalProperties": true});
        assert!(check_strict(&top).unwrap_err().contains("# sets"));
    }
}
