//! text-completion-rust: text completion on the oven Rust SDK (`sdk/rust/oven`).
//!
//! Arguments: PROMPT [MAX_NEW_TOKENS=32] [--chat] [--temperature T] [--seed S] [--n N], as
//! `inferlets/text-completion` (the Python SDK's) takes them. Greedy unless a temperature above 0
//! is given. For each completion it sends the client two messages: the generated token ids
//! ("1 2 3", a final end token included, as hello-rust does), then the text — the Python twin
//! prints the text instead, but wasm32-unknown-unknown has no stdout.
//!
//! With --n N it makes N completions of one prompt at once: the prompt is prefilled once and
//! forked N - 1 times (its full KV pages shared, not copied), and the N decode loops run
//! concurrently, so the host batches their steps together. Completion i samples with seed S + i.
//!
//! The KV cache between prefill and decoding, to exercise the SDK end to end (any mix, in this
//! order): --import NAME builds the context over the pages exported as NAME, which hold this
//! prompt's tokens but the last (what a prefill forwards; see --export); --offload moves the
//! prefilled pages to the host tier and back; --evict frees them (decoding re-prefills);
//! --export NAME publishes them as NAME (the export outlives the instance until released).
//!
//! --pause MS (one completion only) decodes half the tokens, then waits for a client message as an
//! agent waits on a tool (announced with a pause hint of MS milliseconds: the server may keep, swap
//! or discard the context's K/V meanwhile), then decodes the rest.

use oven::{join_all, Context, Greedy, Sampler, Stop, Temperature};

const DEFAULT_MAX_NEW_TOKENS: usize = 32;
const USAGE: &str = "usage: text-completion-rust PROMPT [MAX_NEW_TOKENS] [--chat] [--temperature T] [--seed S] [--n N] \
                     [--import NAME] [--offload] [--evict] [--export NAME] [--pause MS]";

struct Options {
    prompt: String,
    max_new_tokens: usize,
    chat: bool,
    temperature: f64,
    seed: u64,
    num_completions: usize,
    import: Option<String>,
    offload: bool,
    evict: bool,
    export: Option<String>,
    pause_ms: Option<u64>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    fn value<T: std::str::FromStr>(name: &str, value: Option<&String>) -> Result<T, String> {
        let value = value.ok_or_else(|| format!("{} needs a value; {}", name, USAGE))?;
        value.parse().map_err(|_| format!("bad {} {:?}", name, value))
    }
    let mut options = Options {
        prompt: String::new(),
        max_new_tokens: DEFAULT_MAX_NEW_TOKENS,
        chat: false,
        temperature: 0.0,
        seed: 0,
        num_completions: 1,
        import: None,
        offload: false,
        evict: false,
        export: None,
        pause_ms: None,
    };
    let mut positional = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--chat" => options.chat = true,
            "--temperature" => options.temperature = value(arg, rest.next())?,
            "--seed" => options.seed = value(arg, rest.next())?,
            "--n" => options.num_completions = value(arg, rest.next())?,
            "--import" => options.import = Some(value(arg, rest.next())?),
            "--offload" => options.offload = true,
            "--evict" => options.evict = true,
            "--export" => options.export = Some(value(arg, rest.next())?),
            "--pause" => options.pause_ms = Some(value(arg, rest.next())?),
            _ if arg.starts_with("--") => return Err(format!("unknown option {}; {}", arg, USAGE)),
            _ => positional.push(arg),
        }
    }
    match positional.as_slice() {
        [prompt] => options.prompt = prompt.to_string(),
        [prompt, max] => {
            options.prompt = prompt.to_string();
            options.max_new_tokens = value("MAX_NEW_TOKENS", Some(max))?;
        }
        _ => return Err(USAGE.to_string()),
    }
    if options.num_completions == 0 {
        return Err("--n must be at least 1".to_string());
    }
    if options.pause_ms.is_some() && options.num_completions > 1 {
        return Err("--pause makes one completion; drop --n".to_string());
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

/// Decode half of `stop`'s tokens, wait for a client message, decode the rest; the tokens.
async fn with_pause(ctx: &mut Context, sampler: &mut dyn Sampler, stop: &Stop, pause_ms: u64) -> Result<Vec<u32>, String> {
    let max_new_tokens = stop.max_new_tokens();
    let mut generated = ctx.generate_tokens(sampler, &Stop::max_tokens(max_new_tokens / 2)).await?;
    if generated.last().map_or(false, |t| stop.stop_token_ids().contains(t)) {
        return Ok(generated);
    }
    ctx.pause_hint(pause_ms);
    oven::receive().await?;
    let rest = Stop::max_tokens(max_new_tokens - generated.len());
    generated.extend(ctx.generate_tokens(sampler, &rest).await?);
    Ok(generated)
}

async fn main(args: Vec<String>) -> Result<i32, String> {
    let options = parse(&args)?;
    let text = if options.chat {
        oven::render_chat(&["user"], &[options.prompt.as_str()], true)
    } else {
        options.prompt.clone()
    };
    let tokens = oven::tokenize(&text);
    let (last, prefix) = tokens.split_last().ok_or("the prompt tokenizes to no tokens")?;
    let mut prompt = match &options.import {
        Some(name) => Context::imported(name, prefix)?,
        None => Context::new(),
    };
    prompt.fill_tokens(&tokens[prompt.len()..]);
    if options.offload || options.evict || options.export.is_some() {
        prompt.flush().await?; // forwards `prefix`, holds `last` for the first decode step
        if options.offload {
            prompt.offload().await?;
            prompt.restore().await?;
        }
        if options.evict {
            prompt.evict();
        }
        if let Some(name) = &options.export {
            if prompt.export(name).await? != prefix.len() {
                return Err(format!("export {:?} does not hold the prompt but its last token {}", name, last));
            }
        }
    }
    let mut contexts = Vec::with_capacity(options.num_completions);
    for _ in 1..options.num_completions {
        contexts.push(prompt.fork().await?);
    }
    contexts.insert(0, prompt);
    let stop = &Stop::max_tokens(options.max_new_tokens);
    let completions = join_all(contexts.iter_mut().enumerate().map(|(i, ctx)| {
        let mut sampler = sampler(&options, i);
        let pause_ms = options.pause_ms;
        async move {
            match pause_ms {
                Some(ms) => with_pause(ctx, sampler.as_mut(), stop, ms).await,
                None => ctx.generate_tokens(sampler.as_mut(), stop).await,
            }
        }
    }))
    .await;
    let end_tokens = stop.stop_token_ids();
    for generated in completions {
        let generated = generated?;
        let ids: Vec<String> = generated.iter().map(|t| t.to_string()).collect();
        oven::send(&ids.join(" "));
        let text: Vec<u32> = generated.into_iter().filter(|t| !end_tokens.contains(t)).collect();
        oven::send(&oven::detokenize(&text));
    }
    Ok(0)
}

oven::main!(main);
