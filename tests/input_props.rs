//! Property tests over untrusted input: arbitrary bytes and JSON into request validation (through
//! a real server), arbitrary conversations into chat template rendering, and arbitrary token ids
//! into the incremental detokenizer. Nothing may panic; every HTTP answer is a 2xx or an
//! OpenAI-shaped 4xx; the detokenizer's pieces always add up to the whole decode.

mod common;

use common::server::*;
use pagewise::chat::ChatTemplate;
use pagewise::engine::detokenizer::IncrementalDetokenizer;
use pagewise::testing::byte_level_tokenizer;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Any JSON value, nested a few levels, with the field names the API uses mixed in.
fn any_json() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("prompt".to_string()),
        Just("messages".to_string()),
        Just("role".to_string()),
        Just("content".to_string()),
        Just("max_tokens".to_string()),
        Just("n".to_string()),
        Just("stop".to_string()),
        Just("logit_bias".to_string()),
        Just("temperature".to_string()),
        Just("top_logprobs".to_string()),
        Just("logprobs".to_string()),
        Just("tokens".to_string()),
        "[a-z_]{1,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        (0u32..400).prop_map(Value::from),
        ".{0,24}".prop_map(Value::from),
        prop_oneof![Just("user"), Just("assistant"), Just("system"), Just("x")]
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A request body: mostly objects built from [`any_json`], sometimes raw bytes.
fn any_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => any_json().prop_map(|v| v.to_string().into_bytes()),
        2 => (any_json(), any_json()).prop_map(|(p, m)| {
            json!({"prompt": p, "messages": m, "max_tokens": 2}).to_string().into_bytes()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

#[test]
fn arbitrary_bodies_get_a_2xx_or_an_openai_shaped_4xx() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (base, _) = rt.block_on(start(vec![]));
    let client = reqwest::Client::new();
    let config = ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    };
    proptest!(config, |(body in any_body(), path in 0usize..4)| {
        let path = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"][path];
        let (status, reply) = rt.block_on(async {
            let r = client
                .post(format!("{base}{path}"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap())
        });
        prop_assert!(status < 500, "{path} {} -> {status} {reply}", String::from_utf8_lossy(&body));
        if status >= 400 {
            let v: Value = serde_json::from_str(&reply).unwrap();
            prop_assert!(v["error"]["message"].is_string(), "{reply}");
            prop_assert_eq!(v["error"]["code"].as_u64(), Some(u64::from(status)));
        }
    });
    // Still serving.
    let (status, _) = rt.block_on(post(
        &base,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 1}),
    ));
    assert_eq!(status, 200);
}

/// Templates in the styles real models ship: ChatML, and one that reads optional fields, loops
/// over tools and raises on a bad role.
const TEMPLATES: [&str; 2] = [
    CHATML,
    "{{ bos_token }}{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant', 'tool'] %}\
     {{ raise_exception('bad role ' ~ m.role) }}{% endif %}[{{ m.role | upper }}]\
     {% if m.content is string %}{{ m.content | trim }}{% else %}{{ m.content | tojson }}{% endif %}\
     {% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c | tojson }}</call>{% endfor %}{% endif %}\
     {{ eos_token }}{% endfor %}{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}\
     {% if add_generation_prompt %}[ASSISTANT]{% endif %}",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn chat_templates_render_or_fail_cleanly(
        messages in prop::collection::vec(any_json(), 0..5),
        tools in any_json(),
        generation_prompt in any::<bool>(),
        which in 0usize..2,
    ) {
        let template = ChatTemplate::new(TEMPLATES[which], "<s>", "</s>").unwrap();
        let mut extra = Map::new();
        extra.insert("tools".into(), tools);
        // Ok or a ChatError; never a panic.
        let _ = template.render(&Value::Array(messages), generation_prompt, &extra);
    }

    #[test]
    fn incremental_detokenization_adds_up_to_the_whole_decode(
        prompt in prop::collection::vec(0u32..262, 0..8),
        output in prop::collection::vec(0u32..262, 1..40),
        skip_special in any::<bool>(),
    ) {
        // 256 bytes, 4 merges (256..260), <eos> (260), and ids past the vocabulary (261).
        let tokenizer = byte_level_tokenizer(&[("h", "e"), ("l", "l"), ("he", "ll"), ("Ã", "©")]);
        let mut detok = IncrementalDetokenizer::new(&prompt, skip_special);
        let mut text = String::new();
        for &t in &output {
            text.push_str(&detok.step(&tokenizer, t).unwrap());
            prop_assert!(detok.window_len() <= 5 + output.len());
        }
        text.push_str(&detok.flush(&tokenizer).unwrap());
        let whole = tokenizer.decode(&output, skip_special).unwrap();
        // Partial characters decode as U+FFFD either way; the rest must agree. A prompt that
        // ends inside a character may have the output's first bytes complete it: that character
        // is extra, nothing else.
        let (text, whole) = (text.replace('\u{FFFD}', ""), whole.replace('\u{FFFD}', ""));
        if prompt.iter().all(|&t| t < 128) {
            prop_assert_eq!(text, whole);
        } else {
            prop_assert!(text.ends_with(&whole), "{:?} does not end with {:?}", text, whole);
            prop_assert!(text.chars().count() <= whole.chars().count() + 1);
        }
    }
}
