use std::sync::Arc;

use super::*;
use crate::testing::byte_level_tokenizer;

/// Grammars over a byte-level vocabulary (256 bytes, a few merges, `<eos>`), padded to 300 ids.
fn grammars() -> (Grammars, Arc<Tokenizer>, u32) {
    let tokenizer = Arc::new(byte_level_tokenizer(&[
        ("t", "r"),
        ("tr", "ue"),
        ("u", "e"),
    ]));
    let eos = tokenizer.token_to_id("<eos>").unwrap();
    (
        Grammars::new(tokenizer.clone(), 300, &[eos], false),
        tokenizer,
        eos,
    )
}

/// Decodes under `guide` with made-up logits that favour token `(step * 37 + 11) % 300` and
/// otherwise prefer low ids: the constraint alone has to keep the output valid. Returns the text
/// and whether EOS came (the only token a complete grammar allows) before `limit` tokens.
fn decode(guide: &mut Guide, tokenizer: &Tokenizer, eos: u32, limit: usize) -> (String, bool) {
    let mut ids = Vec::new();
    for step in 0..limit {
        let mut row: Vec<f32> = (0..300).map(|i| -(i as f32) / 300.0).collect();
        row[(step * 37 + 11) % 300] = 5.0;
        apply_mask(&mut row, guide.mask().expect("a live guide has a mask"));
        let token = crate::sampler::argmax(&row);
        assert!(row[token as usize].is_finite(), "only allowed tokens win");
        if token == eos {
            return (tokenizer.decode(&ids, true).unwrap(), true);
        }
        ids.push(token);
        guide.advance(token).expect("an allowed token advances");
    }
    (tokenizer.decode(&ids, true).unwrap(), false)
}

#[test]
fn json_schema_output_parses_and_validates() {
    let (g, tok, eos) = grammars();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tag": {"enum": ["red", "green"]}
        },
        "required": ["ok", "n", "tag"],
        "additionalProperties": false
    });
    let mut guide = g.compile(&StructuredOutputs::Json(schema)).unwrap();
    let (text, done) = decode(&mut guide, &tok, eos, 200);
    assert!(done, "the object closes: {text:?}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["ok"].is_boolean(), "{text}");
    assert!((0..=99).contains(&v["n"].as_i64().unwrap()), "{text}");
    assert!(
        ["red", "green"].contains(&v["tag"].as_str().unwrap()),
        "{text}"
    );
    assert!(
        text.contains("\": "),
        "compact separators as json.dumps: {text}"
    );
}

#[test]
fn local_refs_resolve_as_pydantic_writes_nested_models() {
    let (g, tok, eos) = grammars();
    let schema = serde_json::json!({
        "$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                          "required": ["kind"], "additionalProperties": false}},
        "type": "object",
        "properties": {"pet": {"$ref": "#/$defs/Pet"}},
        "required": ["pet"],
        "additionalProperties": false
    });
    let mut guide = g.compile(&StructuredOutputs::Json(schema)).unwrap();
    let (text, done) = decode(&mut guide, &tok, eos, 100);
    assert!(done, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        ["cat", "dog"].contains(&v["pet"]["kind"].as_str().unwrap()),
        "{text}"
    );
}

#[test]
fn choice_regex_and_grammars_hold() {
    let (g, tok, eos) = grammars();
    let choices = vec!["alpha (1)".to_string(), "beta*".to_string()];
    let mut guide = g
        .compile(&StructuredOutputs::Choice(choices.clone()))
        .unwrap();
    let (text, _) = decode(&mut guide, &tok, eos, 50);
    assert!(choices.contains(&text), "{text:?}");

    let mut guide = g
        .compile(&StructuredOutputs::Regex("[0-9]{3}-[a-z]{2}".into()))
        .unwrap();
    let (text, _) = decode(&mut guide, &tok, eos, 50);
    let b = text.as_bytes();
    assert_eq!(b.len(), 6, "{text:?}");
    assert!(
        b[..3].iter().all(u8::is_ascii_digit) && b[3] == b'-',
        "{text:?}"
    );
    assert!(b[4..].iter().all(u8::is_ascii_lowercase), "{text:?}");

    let lark = "start: (\"yes\" | \"no\") \"!\"";
    let mut guide = g.compile(&StructuredOutputs::Grammar(lark.into())).unwrap();
    let (text, _) = decode(&mut guide, &tok, eos, 50);
    assert!(text == "yes!" || text == "no!", "{text:?}");

    let gbnf = "root ::= \"id-\" digit digit\ndigit ::= [0-9]";
    let mut guide = g.compile(&StructuredOutputs::Grammar(gbnf.into())).unwrap();
    let (text, _) = decode(&mut guide, &tok, eos, 50);
    assert!(text.len() == 5 && text.starts_with("id-"), "{text:?}");
}

#[test]
fn json_object_is_any_object() {
    let (g, tok, eos) = grammars();
    let mut guide = g.compile(&StructuredOutputs::JsonObject).unwrap();
    let (text, done) = decode(&mut guide, &tok, eos, 400);
    if done {
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(v.is_object(), "{text}");
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
}

#[test]
fn bad_constraints_fail_to_compile_with_the_compilers_message() {
    let (g, _, _) = grammars();
    let err = g
        .compile(&StructuredOutputs::Json(
            serde_json::json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
        ))
        .unwrap_err();
    assert!(err.contains("no-such-type"), "{err}");
    let err = g
        .compile(&StructuredOutputs::Regex("(unclosed".into()))
        .unwrap_err();
    assert!(!err.is_empty());
    let err = g
        .compile(&StructuredOutputs::Grammar("start: missing_rule".into()))
        .unwrap_err();
    assert!(err.contains("missing_rule"), "{err}");
    assert!(g.compile(&StructuredOutputs::Choice(vec![])).is_err());
}

#[test]
fn a_token_outside_the_mask_fails_the_guide_for_good() {
    let (g, _, _) = grammars();
    let mut guide = g
        .compile(&StructuredOutputs::Regex("[0-9]+".into()))
        .unwrap();
    assert!(guide.mask().unwrap().is_allowed(u32::from(b'7')));
    assert!(!guide.mask().unwrap().is_allowed(u32::from(b'x')));
    let err = guide.advance(u32::from(b'x')).unwrap_err();
    assert!(err.contains("token 120 is not allowed"), "{err}");
    assert!(guide.mask().is_none());
    assert_eq!(guide.error(), Some(err.as_str()));
    assert!(
        guide.advance(u32::from(b'7')).is_err(),
        "a failed guide stays failed"
    );
}

#[test]
fn a_complete_grammar_allows_only_eos_and_says_so() {
    let (g, _, eos) = grammars();
    let mut guide = g
        .compile(&StructuredOutputs::Choice(vec!["ok".into()]))
        .unwrap();
    guide.advance(u32::from(b'o')).unwrap();
    guide.advance(u32::from(b'k')).unwrap();
    assert!(!guide.is_complete(), "known once the last token is taken");
    let mask = guide.mask().unwrap().clone();
    assert!(guide.is_complete());
    assert_eq!(mask.num_set(), 1);
    assert!(mask.is_allowed(eos));
}

#[test]
fn copies_follow_their_own_tokens() {
    let (g, _, _) = grammars();
    let mut a = g
        .compile(&StructuredOutputs::Choice(vec!["ab".into(), "cd".into()]))
        .unwrap();
    let mut b = a.clone();
    a.advance(u32::from(b'a')).unwrap();
    b.advance(u32::from(b'c')).unwrap();
    assert!(a.mask().unwrap().is_allowed(u32::from(b'b')));
    assert!(!b.mask().unwrap().is_allowed(u32::from(b'b')));
    assert!(b.mask().unwrap().is_allowed(u32::from(b'd')));
}

#[test]
fn masks_leave_only_allowed_ids_and_nothing_past_the_mask() {
    let mut mask = SimpleVob::alloc(40);
    mask.allow_token(3);
    mask.allow_token(33);
    let mut row = vec![1.0f32; 70];
    apply_mask(&mut row, &mask);
    let finite: Vec<usize> = (0..70).filter(|&i| row[i].is_finite()).collect();
    assert_eq!(finite, vec![3, 33]);
}
