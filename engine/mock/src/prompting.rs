//! How the mock reads a request's prompt: as its own documented tokenizer does
//! (the flattened text, 4 characters a token: `engine_model::tokenizer`), or with
//! a model's tokenizer and chat template (`--tokenizer`), as vLLM does. Then the
//! prompt the cache sees is the model's token ids written as fixed 4-character
//! codes (`engine_model::tokenizer::id_codes`), so its 64-character blocks are
//! blocks of 16 of the model's tokens, `prompt_tokens` is the ids' count, and the
//! KV events carry the model's ids: what a collector with the same tokenizer
//! (`--kv-tokenizer`) computes.

use engine_model::model_tokenizer::ModelTokenizer;
use engine_model::prompt::{self, Endpoint, PromptError};
use engine_model::tokenizer;
use serde_json::Value;

#[derive(Debug)]
pub enum Prompting {
    /// The mock's own tokens.
    Mock,
    /// A model's tokenizer and template.
    Model(Box<ModelTokenizer>),
}

impl Prompting {
    /// From `--tokenizer` and `--chat-template`.
    pub fn new(
        tokenizer: Option<&std::path::Path>,
        chat_template: Option<&std::path::Path>,
    ) -> anyhow::Result<Prompting> {
        Ok(match tokenizer {
            None => Prompting::Mock,
            Some(path) => Prompting::Model(Box::new(ModelTokenizer::load(path, chat_template)?)),
        })
    }

    /// The prompt the cache reads for `body` sent to `endpoint`.
    pub fn prompt(&self, endpoint: Endpoint, body: &Value) -> Result<String, PromptError> {
        match self {
            Prompting::Mock => prompt::flatten(endpoint, body),
            Prompting::Model(model) => {
                let path = match endpoint {
                    Endpoint::Chat => "/v1/chat/completions",
                    Endpoint::Completions => "/v1/completions",
                    Endpoint::Generate => "/generate",
                };
                model
                    .token_ids(path, body)
                    .map(|ids| tokenizer::id_codes(&ids))
                    .map_err(|e| PromptError(e.to_string()))
            }
        }
    }

    /// How the token ids of a prompt `prompt` made are read back (what the KV
    /// events publish): the mock's own tokens, or the model's ids from their codes.
    pub fn ids_of(&self) -> IdsOf {
        match self {
            Prompting::Mock => tokenizer::token_ids,
            Prompting::Model(_) => tokenizer::code_ids,
        }
    }
}

/// A prompt's token ids, as [`Prompting::ids_of`] reads them.
pub type IdsOf = fn(&str) -> Vec<u32>;

#[cfg(test)]
mod tests {
    use super::*;
    use engine_model::model_tokenizer::fixture::{write_model_dir, TEMPLATE};
    use serde_json::json;

    #[test]
    fn a_models_prompt_is_its_token_ids_four_characters_each() {
        let dir = std::env::temp_dir().join(format!("engine-mock-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_model_dir(&dir, &["hello", "world"], Some(TEMPLATE)).unwrap();
        let model = Prompting::new(Some(&dir), None).unwrap();
        let body = json!({"messages": [{"role": "user", "content": "hello world"}]});
        let prompt = model.prompt(Endpoint::Chat, &body).unwrap();
        let direct = ModelTokenizer::load(&dir, None)
            .unwrap()
            .token_ids("/v1/chat/completions", &body)
            .unwrap();
        // <s> <|user|> hello world </s> <|assistant|>: the template's tokens and the words.
        assert_eq!(direct, vec![1, 3, 6, 7, 2, 4]);
        assert_eq!(
            prompt.chars().count(),
            direct.len() * tokenizer::CHARS_PER_TOKEN
        );
        assert_eq!(model.ids_of()(&prompt), direct);
        // The mock's own: the flattened text, its 4-character tokens.
        let mock = Prompting::new(None, None).unwrap();
        assert_eq!(
            mock.prompt(Endpoint::Chat, &body).unwrap(),
            "user: hello world\n"
        );
        // A completion is encoded with the tokenizer's specials (`<s>` here).
        let text = model.prompt(Endpoint::Generate, &json!({"text": "hello"}));
        assert_eq!(text.map(|p| model.ids_of()(&p)), Ok(vec![1, 6]));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
