//! text-completion-rust: text completion on the oven Rust SDK (`sdk/rust/oven`).
//!
//! Arguments: PROMPT [MAX_NEW_TOKENS=32] [--chat] [--n=N] [--temperature=T] [--seed=S].
//! Greedy unless a temperature above 0 is given. For each completion it sends the client two
//! messages: the generated token ids ("1 2 3", a final stop token included, as hello-rust does),
//! then the text. Built for wasm32-unknown-unknown, which has no stdout, so nothing is printed.
//!
//! With --n=N it makes N completions of one prompt at once: the prompt is prefilled once and
//! forked N - 1 times (its full KV pages shared, not copied), and the N decode loops run
//! concurrently, so the host batches their steps together. Completion i samples with seed S + i.

use oven::{join_all, Context, Greedy, Sampler, Stop, Temperature};

const DEFAULT_MAX_NEW_TOKENS: usize = 32;
const USAGE: &str = "usage: text-completion-rust PROMPT [MAX_NEW_TOKENS] [--chat] [--n=N] [--temperature=T] [--seed=S]";

struct Options {
    prompt: String,
    max_new_tokens: usize,
    chat: bool,
    num_completions: usize,
    temperature: f32,
    seed: u64,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut positional = Vec::new();
    let mut options = Options {
        prompt: String::new(),
        max_new_tokens: DEFAULT_MAX_NEW_TOKENS,
        chat: false,
        num_completions: 1,
        temperature: 0.0,
        seed: 0,
    };
    for arg in args {
        if arg == "--chat" {
            options.chat = true;
        } else if let Some(value) = arg.strip_prefix("--n=") {
            options.num_completions = match value.parse() {
                Ok(n) if n > 0 => n,
                _ => return Err(format!("bad --n {:?}: a positive count", value)),
            };
        } else if let Some(value) = arg.strip_prefix("--temperature=") {
            options.temperature = value.parse().map_err(|_| format!("bad temperature {:?}", value))?;
        } else if let Some(value) = arg.strip_prefix("--seed=") {
            options.seed = value.parse().map_err(|_| format!("bad seed {:?}", value))?;
        } else if arg.starts_with("--") {
            return Err(format!("unknown option {}; {}", arg, USAGE));
        } else {
            positional.push(arg.as_str());
        }
    }
    match positional.as_slice() {
        [prompt] => options.prompt = prompt.to_string(),
        [prompt, max] => {
            options.prompt = prompt.to_string();
            options.max_new_tokens = max.parse().map_err(|_| format!("bad MAX_NEW_TOKENS {:?}", max))?;
        }
        _ => return Err(USAGE.to_string()),
    }
    Ok(options)
}

fn sampler(options: &Options, index: usize) -> Box<dyn Sampler> {
    if options.temperature > 0.0 {
        Box::new(Temperature::new(options.temperature, options.seed.wrapping_add(index as u64)))
    } else {
        Box::new(Greedy)
    }
}

async fn main(args: Vec<String>) -> Result<i32, String> {
    let options = parse(&args)?;
    let mut prompt = Context::new();
    if options.chat {
        prompt.fill_chat(&["user"], &[options.prompt.as_str()], true);
    } else {
        prompt.fill(&options.prompt);
    }
    if prompt.is_empty() {
        return Err("the prompt tokenizes to no tokens".to_string());
    }
    let mut contexts = Vec::with_capacity(options.num_completions);
    for _ in 1..options.num_completions {
        contexts.push(prompt.fork().await?);
    }
    contexts.insert(0, prompt);
    let stop = &Stop::max_tokens(options.max_new_tokens).with_eos();
    let completions = join_all(contexts.iter_mut().enumerate().map(|(i, ctx)| {
        let mut sampler = sampler(&options, i);
        async move { ctx.generate_tokens(sampler.as_mut(), stop).await }
    }))
    .await;
    for generated in completions {
        let generated = generated?;
        let ids: Vec<String> = generated.iter().map(|t| t.to_string()).collect();
        oven::send(&ids.join(" "));
        let text: Vec<u32> = generated.into_iter().filter(|t| !stop.is_stop_token(*t)).collect();
        oven::send(&oven::detokenize(&text));
    }
    Ok(0)
}

oven::main!(main);
