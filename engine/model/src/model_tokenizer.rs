//! A model's own tokenizer and chat template, applied to a request as vLLM applies
//! them before it caches the prompt: a chat's messages rendered through the
//! template (`add_generation_prompt`, the tokenizer config's `bos_token` and
//! `eos_token`), then encoded without special tokens (the template writes them);
//! a completion's `prompt` encoded with them, or taken as is when it is token ids.
//!
//! Loaded from a model directory (`tokenizer.json` and `tokenizer_config.json`, as
//! Hugging Face ships them) or a `tokenizer.json` alone; `--kv-chat-template`
//! replaces the config's template. Templates are Jinja as Hugging Face renders
//! them (`trim_blocks`, `lstrip_blocks`, Python string methods, `raise_exception`,
//! `strftime_now`), by MiniJinja.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

/// Why a request has no token ids to match (the router then routes it by its tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptError {
    /// An API whose prompt the engines' tokenizer does not know.
    Path(String),
    /// A body without a prompt the engine would take.
    Body(String),
}

impl std::fmt::Display for PromptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromptError::Path(p) => write!(f, "no prompt for path `{p}`"),
            PromptError::Body(why) => write!(f, "no prompt in the body: {why}"),
        }
    }
}

/// The template's name in the environment.
const CHAT: &str = "chat";

pub struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
    env: minijinja::Environment<'static>,
    has_template: bool,
    bos_token: String,
    eos_token: String,
    /// Where it was loaded from, for the log.
    pub source: PathBuf,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("source", &self.source)
            .field("has_template", &self.has_template)
            .finish_non_exhaustive()
    }
}

/// A special token as `tokenizer_config.json` gives it: a string, or an object
/// with its `content`.
fn special_token(config: &Value, key: &str) -> String {
    match config.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

/// The config's chat template: a string, or a list of named ones (`default`).
fn config_template(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// `strftime_now(format)`: the UTC date and time now, for the formats templates
/// use (`%d %b %Y` and the like).
fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(format, secs)
}

fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let days = (unix_secs / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let secs_of_day = unix_secs % 86_400;
    let name = MONTHS
        .get((month - 1).clamp(0, 11) as usize)
        .copied()
        .unwrap_or_default();
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(name.get(..3).unwrap_or(name)),
            Some('B') => out.push_str(name),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3_600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn environment(template: Option<String>) -> anyhow::Result<minijinja::Environment<'static>> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        },
    );
    env.add_function("strftime_now", |format: String| strftime_now(&format));
    if let Some(source) = template {
        env.add_template_owned(CHAT, source)
            .context("the chat template does not parse")?;
    }
    Ok(env)
}

impl ModelTokenizer {
    /// Loads `path` (a model directory, or its `tokenizer.json`); `chat_template`
    /// replaces the tokenizer config's.
    pub fn load(path: &Path, chat_template: Option<&Path>) -> anyhow::Result<ModelTokenizer> {
        let (file, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), path.to_path_buf())
        } else {
            let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
            (path.to_path_buf(), dir)
        };
        let tokenizer = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| anyhow::anyhow!("{}: not a tokenizer: {e}", file.display()))?;
        let config_file = dir.join("tokenizer_config.json");
        let config: Value = match std::fs::read(&config_file) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("{}: not JSON", config_file.display()))?,
            Err(_) => Value::Null,
        };
        let template = match chat_template {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .with_context(|| format!("--kv-chat-template {}", p.display()))?,
            ),
            None => config_template(&config),
        };
        let has_template = template.is_some();
        Ok(ModelTokenizer {
            tokenizer,
            env: environment(template)?,
            has_template,
            bos_token: special_token(&config, "bos_token"),
            eos_token: special_token(&config, "eos_token"),
            source: file,
        })
    }

    fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, PromptError> {
        self.tokenizer
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| PromptError::Body(format!("the tokenizer failed: {e}")))
    }

    /// The prompt vLLM renders for a chat request.
    pub fn render_chat(&self, body: &Value) -> Result<String, PromptError> {
        if !self.has_template {
            return Err(PromptError::Body(
                "the model has no chat template (give --kv-chat-template)".into(),
            ));
        }
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| PromptError::Body("'messages' must be an array".into()))?;
        let messages: Vec<Value> = messages.iter().map(string_content).collect();
        let template = self
            .env
            .get_template(CHAT)
            .map_err(|e| PromptError::Body(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| PromptError::Body(format!("the chat template failed: {e}")))
    }

    /// The token ids vLLM computes for `body` at `path`.
    pub fn token_ids(&self, path: &str, body: &Value) -> Result<Vec<u32>, PromptError> {
        match path {
            "/v1/chat/completions" => {
                let prompt = self.render_chat(body)?;
                self.encode(&prompt, false)
            }
            "/v1/completions" | "/generate" => {
                let key = if path == "/generate" {
                    "text"
                } else {
                    "prompt"
                };
                match body.get(key) {
                    Some(Value::String(s)) => self.encode(s, true),
                    // Token ids are the prompt as is.
                    Some(Value::Array(items)) if items.iter().all(Value::is_u64) => items
                        .iter()
                        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                        .collect::<Option<Vec<u32>>>()
                        .ok_or_else(|| PromptError::Body(format!("'{key}': a token id past 2^32"))),
                    Some(Value::Array(items)) => match items.first() {
                        Some(Value::String(s)) => self.encode(s, true),
                        _ => Err(PromptError::Body(format!("'{key}' holds no text"))),
                    },
                    _ => Err(PromptError::Body(format!("'{key}' must be a string"))),
                }
            }
            other => Err(PromptError::Path(other.to_string())),
        }
    }
}

/// A message whose content is a list of parts gets its text parts joined by new
/// lines, as vLLM hands text-only content to a template that takes strings.
fn string_content(message: &Value) -> Value {
    let mut m = message.clone();
    if let Some(Value::Array(parts)) = message.get("content") {
        let text: Vec<&str> = parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text")?.as_str())
            .collect();
        m["content"] = Value::String(text.join("\n"));
    }
    m
}

/// A model the tests build, no download: a word-level `tokenizer.json` and
/// Zephyr's chat template (the collector's unit tests, and end-to-end tests that run
/// the engine mock and the collector on one model directory).
pub mod fixture {
    use serde_json::{json, Value};

    /// The special tokens, ids 0 to 5.
    pub const SPECIALS: [&str; 6] = [
        "<unk>",
        "<s>",
        "</s>",
        "<|user|>",
        "<|assistant|>",
        "<|system|>",
    ];

    /// Zephyr's template shape: a role tag, the content, the end of sequence.
    pub const TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}\
<|{{ message['role'] }}|>\n{{ message['content'].strip() }}{{ eos_token }}\n{% endfor %}\
{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

    /// A word-level tokenizer over [`SPECIALS`] then `words`, split on whitespace and
    /// punctuation, that adds `<s>` with special tokens: what `tokenizers` reads
    /// from a model's `tokenizer.json`.
    pub fn tokenizer_json<S: AsRef<str>>(words: &[S]) -> Value {
        let vocab: serde_json::Map<String, Value> = SPECIALS
            .iter()
            .map(|s| s.to_string())
            .chain(words.iter().map(|w| w.as_ref().to_string()))
            .enumerate()
            .map(|(i, w)| (w, json!(i)))
            .collect();
        let added: Vec<Value> = SPECIALS[1..]
            .iter()
            .enumerate()
            .map(|(i, s)| {
                json!({"id": i + 1, "content": s, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
            },
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
        })
    }

    /// Writes a model directory in `dir`: the tokenizer over `words`, and a
    /// `tokenizer_config.json` with `<s>`, `</s>` and, if given, `template`.
    pub fn write_model_dir<S: AsRef<str>>(
        dir: &std::path::Path,
        words: &[S],
        template: Option<&str>,
    ) -> std::io::Result<()> {
        std::fs::write(
            dir.join("tokenizer.json"),
            tokenizer_json(words).to_string(),
        )?;
        let mut config = json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}});
        if let Some(t) = template {
            config["chat_template"] = json!(t);
        }
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use super::fixture::{write_model_dir, TEMPLATE};

    /// The vocabulary the tests' prompts use.
    const WORDS: [&str; 8] = [
        "hello", "world", "you", "are", "helpful", ".", "answer", "me",
    ];

    fn model_dir(template: Option<&str>) -> tempdir::Dir {
        let dir = tempdir::Dir::new();
        write_model_dir(dir.path(), &WORDS, template).unwrap();
        dir
    }

    /// A directory removed on drop.
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let n = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                let p = std::env::temp_dir()
                    .join(format!("llm-collector-tok-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn chat() -> Value {
        json!({"model": "m", "messages": [
            {"role": "system", "content": "  you are helpful .  "},
            {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "world"}]},
        ]})
    }

    #[test]
    fn a_chat_is_rendered_by_its_template_and_encoded_without_added_specials() {
        let dir = model_dir(Some(TEMPLATE));
        let t = ModelTokenizer::load(dir.path(), None).unwrap();
        let rendered = t.render_chat(&chat()).unwrap();
        assert_eq!(
            rendered,
            "<s><|system|>\nyou are helpful .</s>\n<|user|>\nhello\nworld</s>\n<|assistant|>\n"
        );
        // <s> written by the template, once: no second one added by the encoder.
        assert_eq!(
            t.token_ids("/v1/chat/completions", &chat()).unwrap(),
            [1, 5, 8, 9, 10, 11, 2, 3, 6, 7, 2, 4]
        );
    }

    #[test]
    fn a_completion_gets_the_tokenizers_specials_and_token_ids_stay_as_they_are() {
        let t = ModelTokenizer::load(&model_dir(None).path().join("tokenizer.json"), None).unwrap();
        let ids = |body: Value| t.token_ids("/v1/completions", &body);
        assert_eq!(ids(json!({"prompt": "hello world"})).unwrap(), [1, 6, 7]);
        assert_eq!(
            ids(json!({"prompt": ["hello world", "me"]})).unwrap(),
            [1, 6, 7]
        );
        assert_eq!(ids(json!({"prompt": [6, 7, 99]})).unwrap(), [6, 7, 99]);
        assert!(ids(json!({"prompt": 3})).is_err());
        assert_eq!(
            t.token_ids("/generate", &json!({"text": "answer me"}))
                .unwrap(),
            [1, 12, 13]
        );
        assert!(matches!(
            t.token_ids("/v1/embeddings", &json!({})),
            Err(PromptError::Path(_))
        ));
        // No template in the config, none given: a chat is refused, with the reason.
        let err = t.token_ids("/v1/chat/completions", &chat()).unwrap_err();
        assert!(err.to_string().contains("--kv-chat-template"), "{err}");
    }

    #[test]
    fn a_given_template_replaces_the_configs_and_its_errors_are_the_requests() {
        let dir = model_dir(Some("{{ nonsense"));
        assert!(
            ModelTokenizer::load(dir.path(), None).is_err(),
            "a template that does not parse is refused at start"
        );
        let file = dir.path().join("given.jinja");
        std::fs::write(&file, TEMPLATE).unwrap();
        let t = ModelTokenizer::load(dir.path(), Some(&file)).unwrap();
        assert!(t.render_chat(&chat()).is_ok());
        let tool = json!({"messages": [{"role": "tool", "content": "x"}]});
        let err = t.render_chat(&tool).unwrap_err();
        assert!(err.to_string().contains("unknown role tool"), "{err}");
        assert!(t.render_chat(&json!({"messages": "no"})).is_err());
    }

    #[test]
    fn named_templates_and_special_tokens_read_as_hugging_face_writes_them() {
        let config = json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "y"}],
        });
        assert_eq!(special_token(&config, "bos_token"), "<s>");
        assert_eq!(special_token(&config, "eos_token"), "");
        assert_eq!(config_template(&config).as_deref(), Some("y"));
        assert_eq!(config_template(&json!({})), None);
    }

    #[test]
    fn dates_format_as_python_does() {
        // 2024-07-23 14:05:09 UTC.
        let t = 1_721_743_509;
        assert_eq!(strftime("%d %b %Y", t), "23 Jul 2024");
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-07-23 14:05:09");
        assert_eq!(strftime("%B %y %% %q", t), "July 24 % %q");
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
        assert_eq!(strftime("%d %b %Y", 951_782_400), "29 Feb 2000");
    }
}
