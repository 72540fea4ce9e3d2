//! The library API, mirroring vLLM's `LLM`: load once, then `generate` many prompts, batched
//! continuously inside, outputs in input order.

use std::collections::HashMap;

use crate::chat::ChatMessage;
use crate::engine::args::{EngineArgs, EngineError};
use crate::engine::core::EngineCore;
use crate::request::{FinishReason, SamplingParams};
use crate::sampler::Logprobs;
use crate::sequence::SeqId;

/// One completion of a prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionOutput {
    /// Which of the `n` completions.
    pub index: usize,
    /// The generated text (stop string excluded unless asked for).
    pub text: String,
    /// The generated token ids (EOS or a stop token id included when that ended it).
    pub token_ids: Vec<u32>,
    /// Why it ended.
    pub finish_reason: Option<FinishReason>,
    /// Per-token logprobs, when requested.
    pub logprobs: Option<Vec<Logprobs>>,
}

/// Everything generated for one prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestOutput {
    /// The prompt text (empty when given as token ids).
    pub prompt: String,
    /// The prompt's token ids.
    pub prompt_token_ids: Vec<u32>,
    /// The `n` completions, by index.
    pub outputs: Vec<CompletionOutput>,
    /// With `SamplingParams::prompt_logprobs`: each prompt token's logprobs (`None` for the
    /// first, which nothing precedes), as vLLM's `RequestOutput.prompt_logprobs`.
    pub prompt_logprobs: Option<Vec<Option<Logprobs>>>,
}

/// An offline inference engine: `Llm::new(EngineArgs { model, .. })?.generate(&prompts, &params)`.
pub struct Llm {
    core: EngineCore,
}

impl Llm {
    /// Loads the model. Under tensor parallelism (`args.parallel`) this process is rank 0 and
    /// starts this node's other ranks; losing one ends the process with status 1 (a step may be
    /// waiting on a collective that will never finish, and nothing else can end that wait).
    pub fn new(args: EngineArgs) -> Result<Self, EngineError> {
        let core = EngineCore::new(&args)?;
        if let Some(leader) = core.tp_leader() {
            leader.watch(|reason| {
                tracing::error!("{reason}; exiting");
                std::process::exit(1);
            });
        }
        Ok(Llm { core })
    }

    /// The engine underneath (tokenizer, config, scheduler state).
    pub fn core(&self) -> &EngineCore {
        &self.core
    }

    /// The engine, mutable (step-time accounting, aborts).
    pub fn core_mut(&mut self) -> &mut EngineCore {
        &mut self.core
    }

    /// Token ids of each text (`add_special`: the tokenizer's BOS/EOS post-processing).
    fn encode_all<S: AsRef<str>>(
        &self,
        texts: &[S],
        add_special: bool,
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        let tokenizer = self.core.tokenizer();
        texts
            .iter()
            .map(|t| {
                tokenizer
                    .encode(t.as_ref(), add_special)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|e| EngineError::Tokenizer(e.to_string()))
            })
            .collect()
    }

    /// The token ids [`Self::generate`] feeds for `text`, or with `chat` those [`Self::chat`]
    /// feeds for `text` as one user message.
    pub fn prompt_tokens(&self, text: &str, chat: bool) -> Result<Vec<u32>, EngineError> {
        if !chat {
            return Ok(self.encode_all(&[text], true)?.remove(0));
        }
        let template = self.core.chat_template()?;
        let rendered = template.render_messages(&[ChatMessage::new("user", text)])?;
        Ok(self.encode_all(&[rendered], false)?.remove(0))
    }

    /// Generates for each prompt; outputs are in input order.
    pub fn generate<S: AsRef<str>>(
        &mut self,
        prompts: &[S],
        params: &SamplingParams,
    ) -> Result<Vec<RequestOutput>, EngineError> {
        let encoded = self.encode_all(prompts, true)?;
        let mut outputs = self.generate_tokens(encoded, params)?;
        for (out, p) in outputs.iter_mut().zip(prompts) {
            out.prompt = p.as_ref().to_string();
        }
        Ok(outputs)
    }

    /// Chats: renders each conversation with the model's chat template (generation prompt added),
    /// then generates like [`Self::generate`].
    pub fn chat(
        &mut self,
        conversations: &[Vec<ChatMessage>],
        params: &SamplingParams,
    ) -> Result<Vec<RequestOutput>, EngineError> {
        let template = self.core.chat_template()?;
        let rendered = conversations
            .iter()
            .map(|c| template.render_messages(c))
            .collect::<Result<Vec<_>, _>>()?;
        // The template already holds any BOS the model wants: no special tokens added.
        let encoded = self.encode_all(&rendered, false)?;
        let mut outputs = self.generate_tokens(encoded, params)?;
        for (out, text) in outputs.iter_mut().zip(rendered) {
            out.prompt = text;
        }
        Ok(outputs)
    }

    /// Generates for prompts given as token ids.
    pub fn generate_tokens(
        &mut self,
        prompts: Vec<Vec<u32>>,
        params: &SamplingParams,
    ) -> Result<Vec<RequestOutput>, EngineError> {
        self.generate_tokens_each(prompts, std::slice::from_ref(params))
    }

    /// Generates for prompts given as token ids, each with its own parameters (`params[i]` for
    /// prompt `i`, as vLLM takes a list of sampling parameters), or all with `params[0]` when
    /// one is given.
    pub fn generate_tokens_each(
        &mut self,
        prompts: Vec<Vec<u32>>,
        params: &[SamplingParams],
    ) -> Result<Vec<RequestOutput>, EngineError> {
        if params.len() != 1 && params.len() != prompts.len() {
            return Err(EngineError::Config(format!(
                "{} sampling parameters for {} prompts: give one, or one per prompt",
                params.len(),
                prompts.len()
            )));
        }
        let mut results: Vec<RequestOutput> = Vec::with_capacity(prompts.len());
        let mut owner: HashMap<SeqId, (usize, usize)> = HashMap::new();
        for (i, prompt) in prompts.into_iter().enumerate() {
            let params = &params[i.min(params.len() - 1)];
            let ids = match self.core.add(prompt.clone(), params.clone(), None) {
                Ok(ids) => ids,
                Err(e) => {
                    for &id in owner.keys() {
                        self.core.abort(id);
                    }
                    return Err(e);
                }
            };
            for (choice, id) in ids.into_iter().enumerate() {
                owner.insert(id, (i, choice));
            }
            results.push(RequestOutput {
                prompt: String::new(),
                prompt_token_ids: prompt,
                outputs: (0..params.n)
                    .map(|index| CompletionOutput {
                        index,
                        text: String::new(),
                        token_ids: Vec::new(),
                        finish_reason: None,
                        logprobs: params.logprobs.map(|_| Vec::new()),
                    })
                    .collect(),
                prompt_logprobs: None,
            });
        }
        while self.core.has_unfinished() {
            for event in self.core.step()? {
                let Some(&(i, choice)) = owner.get(&event.seq_id) else {
                    continue;
                };
                if let Some(e) = event.error {
                    for &id in owner.keys() {
                        self.core.abort(id);
                    }
                    return Err(EngineError::Tokenizer(e));
                }
                if let Some(lps) = event.prompt_logprobs {
                    results[i].prompt_logprobs = Some(
                        std::iter::once(None)
                            .chain(lps.into_iter().map(Some))
                            .collect(),
                    );
                }
                let out = &mut results[i].outputs[choice];
                out.text.push_str(&event.text);
                out.token_ids.push(event.token_id);
                if let (Some(list), Some(lp)) = (out.logprobs.as_mut(), event.logprobs) {
                    list.push(lp);
                }
                out.finish_reason = event.finish;
            }
        }
        Ok(results)
    }
}
