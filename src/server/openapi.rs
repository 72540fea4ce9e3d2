//! GET /openapi.json: an OpenAPI 3.1 document of the HTTP API. Every request and response schema
//! is generated from the Rust types the handlers use ([`super::protocol`], [`super::responses`])
//! by `schemars`; only the list of routes and their status codes is written here, and the limits
//! of the served model (context length, vocabulary, `--max-num-seqs`) are added to the generated
//! schemas. Fuzzers (schemathesis, in CI) check the live server against it.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use super::anthropic::error::AnthropicErrorBody;
use super::anthropic::output::{MessageResponse, TokenCount};
use super::anthropic::request::MessagesRequest;
use super::protocol::{ChatRequest, CompletionRequest};
use super::responses::{
    ChatCompletionResponse, CompletionResponse, DetokenizeRequest, DetokenizeResponse,
    ErrorResponse, ModelList, TokenizeRequest, TokenizeResponse, VersionResponse,
};
use super::responses_api::output::{ResponseDeleted, ResponseObject};
use super::responses_api::request::ResponsesRequest;
use super::routes::MAX_MESSAGES;
use crate::engine::handle::ModelInfo;
use crate::request::{MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS};

/// Statuses every guarded route may answer with an error body.
const ERRORS: [(u16, &str); 7] = [
    (400, "Invalid request"),
    (401, "Missing or wrong API key"),
    (404, "Unknown model"),
    (413, "Body too large"),
    (415, "Not JSON"),
    (500, "Engine failure of this request"),
    (503, "Loading, draining, or the engine has stopped"),
];

struct Doc {
    generator: SchemaGenerator,
    paths: Map<String, Value>,
}

impl Doc {
    fn schema<T: JsonSchema>(&mut self) -> Value {
        self.generator.subschema_for::<T>().to_value()
    }

    fn json_content<T: JsonSchema>(&mut self) -> Value {
        json!({"application/json": {"schema": self.schema::<T>()}})
    }

    /// Error responses for `statuses` (and 429 where `overload`).
    fn errors(&mut self, statuses: &[u16], overload: bool) -> Map<String, Value> {
        self.errors_as::<ErrorResponse>(statuses, overload)
    }

    /// [`Doc::errors`] with bodies of type `E`.
    fn errors_as<E: JsonSchema>(&mut self, statuses: &[u16], overload: bool) -> Map<String, Value> {
        let mut out = Map::new();
        for (status, why) in ERRORS.iter().filter(|(s, _)| statuses.contains(s)) {
            let content = self.json_content::<E>();
            out.insert(
                status.to_string(),
                json!({"description": why, "content": content}),
            );
        }
        if overload {
            let content = self.json_content::<E>();
            out.insert(
                "429".into(),
                json!({"description": "Too many requests wait (Retry-After)", "content": content}),
            );
        }
        out
    }

    fn route(&mut self, path: &str, method: &str, op: Value) {
        let entry = self.paths.entry(path.to_string()).or_insert(json!({}));
        entry[method] = op;
    }

    /// A POST route taking `Req` and answering `Resp` (or an SSE stream, when `streams`).
    fn post<Req: JsonSchema, Resp: JsonSchema>(
        &mut self,
        path: &str,
        summary: &str,
        streams: bool,
        overload: bool,
    ) {
        self.post_as::<Req, Resp, ErrorResponse>(path, summary, streams, overload);
    }

    /// [`Doc::post`] with error bodies of type `E`.
    fn post_as<Req: JsonSchema, Resp: JsonSchema, E: JsonSchema>(
        &mut self,
        path: &str,
        summary: &str,
        streams: bool,
        overload: bool,
    ) {
        let body = self.json_content::<Req>();
        let mut ok = self.json_content::<Resp>();
        if streams {
            // Each event's data: a chunk of `Resp`'s shape with `delta`s (chat) or text pieces,
            // an error object, or the final `[DONE]`.
            ok["text/event-stream"] = json!({"schema": {
                "type": "object",
                "properties": {"data": {"type": "string"}},
                "required": ["data"],
            }});
        }
        let mut responses = self.errors_as::<E>(&[400, 401, 404, 413, 415, 500, 503], overload);
        responses.insert("200".into(), json!({"description": "OK", "content": ok}));
        let op = json!({
            "summary": summary,
            "operationId": path.trim_start_matches('/').replace(['/', '.'], "_"),
            "requestBody": {"required": true, "content": body},
            "responses": responses,
        });
        self.route(path, "post", op);
    }

    /// A `method` route on a stored object (`path` ends in `{id}`) answering `Resp`, or 401 and
    /// 404.
    fn by_id<Resp: JsonSchema>(&mut self, path: &str, method: &str, summary: &str) {
        let mut responses = self.errors(&[401, 404], false);
        let ok = self.json_content::<Resp>();
        responses.insert("200".into(), json!({"description": "OK", "content": ok}));
        let op = json!({
            "summary": summary,
            "operationId": format!("{method}_{}", path.trim_start_matches('/').replace(['/', '.', '{', '}'], "_")),
            "parameters": [{"name": "id", "in": "path", "required": true,
                            "schema": {"type": "string"}}],
            "responses": responses,
        });
        self.route(path, method, op);
    }

    /// A GET route answering `ok` (a response object) or the errors of `statuses`.
    fn get(&mut self, path: &str, summary: &str, ok: Value, statuses: &[u16]) {
        let mut responses = self.errors(statuses, false);
        responses.insert("200".into(), ok);
        let op = json!({"summary": summary, "responses": responses,
                        "operationId": path.trim_start_matches('/').replace(['/', '.'], "_")});
        self.route(path, "get", op);
    }
}

/// Sets `key: value` on the schema at `pointer` (within `components.schemas`), if it exists.
fn limit(schemas: &mut Value, pointer: &str, key: &str, value: Value) {
    if let Some(Value::Object(schema)) = schemas.pointer_mut(pointer) {
        schema.insert(key.to_string(), value);
    }
}

/// The served model's limits, on the generated schemas.
fn add_limits(schemas: &mut Value, info: &ModelInfo) {
    let last_token = json!(info.vocab_size.saturating_sub(1));
    let context = json!(info.max_model_len);
    for req in ["CompletionRequest", "ChatRequest"] {
        let props = format!("/{req}/properties");
        limit(
            schemas,
            &format!("{props}/n"),
            "maximum",
            json!(info.max_num_seqs),
        );
        limit(
            schemas,
            &format!("{props}/max_tokens"),
            "maximum",
            context.clone(),
        );
        limit(
            schemas,
            &format!("{props}/stop_token_ids"),
            "maxItems",
            json!(MAX_STOP_TOKEN_IDS),
        );
        limit(
            schemas,
            &format!("{props}/stop_token_ids/items"),
            "maximum",
            last_token.clone(),
        );
    }
    limit(
        schemas,
        "/ChatRequest/properties/max_completion_tokens",
        "maximum",
        context.clone(),
    );
    limit(
        schemas,
        "/ResponsesRequest/properties/max_output_tokens",
        "maximum",
        context.clone(),
    );
    limit(
        schemas,
        "/MessagesRequest/properties/max_tokens",
        "maximum",
        context,
    );
    limit(
        schemas,
        "/MessagesRequest/properties/messages",
        "minItems",
        json!(1),
    );
    limit(
        schemas,
        "/MessagesRequest/properties/messages",
        "maxItems",
        json!(MAX_MESSAGES),
    );
    limit(
        schemas,
        "/ChatRequest/properties/messages",
        "minItems",
        json!(1),
    );
    limit(
        schemas,
        "/ChatRequest/properties/messages",
        "maxItems",
        json!(MAX_MESSAGES),
    );
    // PromptInput: text, texts, ids, lists of ids; none of them empty.
    limit(schemas, "/PromptInput/anyOf/0", "minLength", json!(1));
    limit(schemas, "/PromptInput/anyOf/1", "minItems", json!(1));
    limit(schemas, "/PromptInput/anyOf/1/items", "minLength", json!(1));
    limit(schemas, "/PromptInput/anyOf/2", "minItems", json!(1));
    limit(
        schemas,
        "/PromptInput/anyOf/2/items",
        "maximum",
        last_token.clone(),
    );
    limit(schemas, "/PromptInput/anyOf/3", "minItems", json!(1));
    limit(schemas, "/PromptInput/anyOf/3/items", "minItems", json!(1));
    limit(
        schemas,
        "/PromptInput/anyOf/3/items/items",
        "maximum",
        last_token.clone(),
    );
    limit(
        schemas,
        "/StopInput/anyOf/1",
        "maxItems",
        json!(MAX_STOP_STRINGS),
    );
    limit(
        schemas,
        "/DetokenizeRequest/properties/tokens/items",
        "maximum",
        last_token,
    );
}

/// The whole document, with the limits of the model `info` describes, served as `served`.
pub fn document(info: &ModelInfo, served: &[String]) -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    });
    let mut doc = Doc {
        generator: settings.into_generator(),
        paths: Map::new(),
    };
    doc.post::<CompletionRequest, CompletionResponse>(
        "/v1/completions",
        "Text completion (OpenAI legacy completions)",
        true,
        true,
    );
    doc.post::<ChatRequest, ChatCompletionResponse>(
        "/v1/chat/completions",
        "Chat completion",
        true,
        true,
    );
    doc.post::<ResponsesRequest, ResponseObject>(
        "/v1/responses",
        "Create a response (OpenAI Responses API)",
        true,
        true,
    );
    doc.by_id::<ResponseObject>("/v1/responses/{id}", "get", "A stored response");
    doc.by_id::<ResponseDeleted>("/v1/responses/{id}", "delete", "Forget a stored response");
    doc.post_as::<MessagesRequest, MessageResponse, AnthropicErrorBody>(
        "/v1/messages",
        "Create a message (Anthropic Messages API)",
        true,
        true,
    );
    // (/v1/messages requires `max_tokens`; count_tokens shares the type without it.)
    let create = &mut doc.paths["/v1/messages"]["post"]["requestBody"]["content"];
    let shared = create["application/json"]["schema"].take();
    create["application/json"]["schema"] = json!({"allOf": [shared, {"required": ["max_tokens"]}]});
    doc.post_as::<MessagesRequest, TokenCount, AnthropicErrorBody>(
        "/v1/messages/count_tokens",
        "Count a message's prompt tokens (Anthropic Messages API)",
        false,
        true,
    );
    doc.post::<TokenizeRequest, TokenizeResponse>("/tokenize", "Tokenize", false, false);
    doc.post::<DetokenizeRequest, DetokenizeResponse>("/detokenize", "Detokenize", false, false);
    let models = doc.json_content::<ModelList>();
    doc.get(
        "/v1/models",
        "Served models",
        json!({"description": "OK", "content": models}),
        &[401],
    );
    let version = doc.json_content::<VersionResponse>();
    doc.get(
        "/version",
        "Server version",
        json!({"description": "OK", "content": version}),
        &[],
    );
    let plain = json!({"text/plain": {"schema": {"type": "string"}}});
    doc.get(
        "/metrics",
        "Prometheus metrics",
        json!({"description": "OK", "content": plain}),
        &[],
    );
    let alive = json!({"description": "The engine runs"});
    doc.get("/health", "Liveness", alive, &[503]);
    let ready = json!({"description": "Accepting requests"});
    doc.get("/ready", "Readiness", ready, &[503]);
    let openapi = json!({"description": "This document",
                         "content": {"application/json": {"schema": {"type": "object"}}}});
    doc.get("/openapi.json", "The OpenAPI document", openapi, &[]);
    let mut schemas = Value::Object(doc.generator.take_definitions(true));
    add_limits(&mut schemas, info);
    // Anthropic's `model` is required: name the models served.
    limit(
        &mut schemas,
        "/MessagesRequest/properties/model",
        "enum",
        json!(served),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "pagewise",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "An OpenAI-compatible LLM inference server.",
        },
        "paths": doc.paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    })
}
