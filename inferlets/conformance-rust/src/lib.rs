//! conformance-rust: the scenarios of `inferlets/conformance` (whose docstring lists them) on the
//! Rust SDK, one JSON message each, written to equal its twin's message for message;
//! `tests/test_sdk_conformance.py` runs both and compares.

mod json;

use oven::{
    join, join_all, sleep, Context, Distribution, Grammar, Greedy, MinP, Rng, Sampler, Shape, Stop, Temperature, TopK,
    TopP,
};

use json::{dist, ints, list, object, text};

type Outcome = Result<String, String>;

fn number<T: std::str::FromStr>(value: &str) -> Result<T, String> {
    value.parse().map_err(|_| format!("bad number {:?}", value))
}

fn sampler(spec: &str) -> Result<Box<dyn Sampler>, String> {
    let fields: Vec<&str> = spec.split(':').collect();
    let seed = || number::<u64>(fields[fields.len() - 1]);
    Ok(match fields[0] {
        "greedy" => Box::new(Greedy),
        "temperature" => Box::new(Temperature::new(number(fields[1])?, seed()?)),
        "top_k" => Box::new(TopK::new(number(fields[1])?, number(fields[2])?, seed()?)),
        "top_p" => Box::new(TopP::new(number(fields[1])?, number(fields[2])?, seed()?)),
        "min_p" => Box::new(MinP::new(number(fields[1])?, number(fields[2])?, seed()?)),
        _ => return Err(format!("unknown sampler {:?}", spec)),
    })
}

fn stop(max_tokens: &str, options: &[&str]) -> Result<Stop, String> {
    let mut stop = Stop::max_tokens(number(max_tokens)?);
    for option in options {
        if let Some(token) = option.strip_prefix("token=") {
            stop = stop.with_tokens(&[number(token)?]);
        } else if let Some(string) = option.strip_prefix("string=") {
            stop = stop.with_string(string);
        } else if *option == "noeos" {
            stop = stop.without_eos();
        }
    }
    Ok(stop)
}

fn handles(ctx: &Context) -> String {
    ints(ctx.page_handles())
}

async fn generate(spec: &str, prompt: &str, max_tokens: &str, options: &[&str]) -> Outcome {
    let mut ctx = Context::new();
    ctx.fill(prompt);
    let start = ctx.len();
    let text_out = ctx.generate(sampler(spec)?.as_mut(), &stop(max_tokens, options)?).await?;
    Ok(object(&[("tokens", ints(&ctx.token_ids()[start..])), ("text", text(&text_out)), ("pages", handles(&ctx))]))
}

async fn steps(spec: &str, prompt: &str, max_tokens: &str) -> Outcome {
    let mut ctx = Context::new();
    ctx.fill(prompt);
    ctx.flush().await?;
    let mut chosen = sampler(spec)?;
    let mut tokens = Vec::new();
    for _ in 0..number::<usize>(max_tokens)? {
        tokens.push(ctx.decode_step(chosen.as_mut()).await?);
    }
    Ok(object(&[("tokens", ints(&tokens)), ("pages", handles(&ctx))]))
}

async fn fork(prompt: &str, n: &str, max_tokens: &str) -> Outcome {
    let mut root = Context::new();
    root.fill(prompt);
    let mut forks = Vec::new();
    for _ in 0..number::<usize>(n)? {
        forks.push(root.fork().await?);
    }
    forks.insert(0, root);
    let after_fork = list(forks.iter().map(handles));
    let stop = &Stop::max_tokens(number(max_tokens)?);
    let generated = join_all(forks.iter_mut().enumerate().map(|(i, ctx)| async move {
        ctx.generate_tokens(&mut TopK::new(50, 1.0, i as u64), stop).await
    }))
    .await;
    let tokens = generated.into_iter().collect::<Result<Vec<_>, String>>()?;
    Ok(object(&[
        ("after_fork", after_fork),
        ("tokens", list(tokens.iter().map(|t| ints(t)))),
        ("after_generate", list(forks.iter().map(handles))),
    ]))
}

async fn drop_range(prompt: &str, start: &str, end: &str) -> Outcome {
    let (start, end) = (number(start)?, number(end)?);
    let mut root = Context::new();
    root.fill(prompt);
    root.flush().await?;
    let (before, hidden, shown, after) = {
        let mut child = root.fork().await?;
        let before = handles(&child);
        child.drop_range(start, end).await?;
        let hidden = child.next_dist(5).await?;
        child.undrop_range(start, end).await?;
        let shown = child.next_dist(5).await?;
        (before, hidden, shown, handles(&child))
    };
    let root_dist = root.next_dist(5).await?;
    Ok(object(&[
        ("before", before),
        ("after", after),
        ("root", handles(&root)),
        ("hidden", dist(&hidden)),
        ("shown", dist(&shown)),
        ("root_dist", dist(&root_dist)),
    ]))
}

async fn share(prompt: &str, max_tokens: &str) -> Outcome {
    let name = format!("conformance/{}", oven::instance_id());
    let tokens = oven::tokenize(prompt);
    let stop = Stop::max_tokens(number(max_tokens)?);
    let mut exporter = Context::new();
    exporter.fill_tokens(&tokens);
    exporter.flush().await?;
    let count = exporter.export(&name).await?;
    let (imported, generated, after) = {
        let mut importer = Context::imported(&name, &tokens[..count])?;
        importer.fill_tokens(&tokens[count..]);
        let imported = handles(&importer);
        let (a, b) = join(exporter.generate_tokens(&mut Greedy, &stop), importer.generate_tokens(&mut Greedy, &stop)).await;
        (imported, list([ints(&a?), ints(&b?)].iter().cloned()), list([handles(&exporter), handles(&importer)].iter().cloned()))
    };
    Context::release_export(&name)?;
    let missing = match Context::imported(&name, &tokens[..count]) {
        Ok(_) => "null".to_string(),
        Err(message) => text(&message),
    };
    Ok(object(&[
        ("count", count.to_string()),
        ("imported", imported),
        ("tokens", generated),
        ("after", after),
        ("missing", missing),
    ]))
}

async fn snapshot(prompt: &str, more: &str, max_tokens: &str) -> Outcome {
    let name = format!("conformance/snapshot/{}", oven::instance_id());
    let tokens = oven::tokenize(prompt);
    let stop = Stop::max_tokens(number(max_tokens)?);
    let (count, taken) = {
        let mut maker = Context::new();
        maker.fill_tokens(&tokens);
        maker.flush().await?;
        let count = maker.snapshot(&name).await?;
        let taken = match maker.snapshot(&name).await {
            Ok(_) => "null".to_string(),
            Err(message) => text(&message),
        };
        (count, taken)
    };
    let mut prompt_more = tokens.clone();
    prompt_more.extend(oven::tokenize(more));
    let (reused, pages, mut generated, after) = {
        let mut reuser = Context::from_prefix(&prompt_more);
        let (reused, pages) = (reuser.len() - reuser.num_pending(), handles(&reuser));
        let mut forked = reuser.fork().await?;
        let (a, b) = join(reuser.generate_tokens(&mut Greedy, &stop), forked.generate_tokens(&mut Greedy, &stop)).await;
        let after = list([handles(&reuser), handles(&forked)].iter().cloned());
        (reused, pages, vec![ints(&a?), ints(&b?)], after)
    };
    {
        let mut opened = Context::from_snapshot(&name)?;
        opened.fill_tokens(&tokens[count..]);
        generated.push(ints(&opened.generate_tokens(&mut Greedy, &stop).await?));
    }
    Context::drop_snapshot(&name)?;
    let missing = match Context::from_snapshot(&name) {
        Ok(_) => "null".to_string(),
        Err(message) => text(&message),
    };
    Ok(object(&[
        ("count", count.to_string()),
        ("reused", reused.to_string()),
        ("pages", pages),
        ("tokens", list(generated.iter().cloned())),
        ("after", after),
        ("taken", taken),
        ("missing", missing),
    ]))
}

async fn truncate(prompt: &str, max_tokens: &str, keep: &str) -> Outcome {
    let stop = Stop::max_tokens(number(max_tokens)?);
    let mut ctx = Context::new();
    ctx.fill(prompt);
    let first = ctx.generate_tokens(&mut Greedy, &stop).await?;
    ctx.truncate(number(keep)?);
    let pages = handles(&ctx);
    let second = ctx.generate_tokens(&mut Greedy, &stop).await?;
    Ok(object(&[
        ("tokens", list([ints(&first), ints(&second)].iter().cloned())),
        ("truncated_pages", pages),
        ("pages", handles(&ctx)),
    ]))
}

async fn kv(prompt: &str, steps: &str, max_tokens: &str, mode: &str) -> Outcome {
    let mut ctx = Context::new();
    ctx.fill(prompt);
    ctx.flush().await?;
    for _ in 0..number::<usize>(steps)? {
        ctx.decode_step(&mut Greedy).await?;
    }
    match mode {
        "offload" => {
            ctx.offload().await?;
            ctx.restore().await?;
        }
        "evict" => ctx.evict(),
        "pause" => {
            ctx.pause_hint(20);
            sleep(20).await?;
        }
        _ => ctx.free_pages_ahead(),
    }
    let after = handles(&ctx);
    let tokens = ctx.generate_tokens(&mut Greedy, &Stop::max_tokens(number(max_tokens)?)).await?;
    Ok(object(&[("after", after), ("tokens", ints(&tokens)), ("pages", handles(&ctx))]))
}

async fn ahead(prompt: &str, max_tokens: &str, token: &str) -> Outcome {
    let mut ctx = Context::new();
    ctx.fill(prompt);
    let stop = Stop::max_tokens(number(max_tokens)?).with_tokens(&[number(token)?]);
    let tokens = ctx.generate_tokens(&mut Greedy, &stop).await?;
    let before = handles(&ctx);
    ctx.free_pages_ahead();
    Ok(object(&[("tokens", ints(&tokens)), ("before", before), ("after", handles(&ctx))]))
}

/// A built-in sampler run by the inferlet: a sampler of one's own keeps `generate` step by step.
struct Stepwise<'a>(&'a mut dyn Sampler);

impl Sampler for Stepwise<'_> {
    fn top_k(&self) -> u32 {
        self.0.top_k()
    }

    fn sample(&mut self, dist: &Distribution) -> u32 {
        self.0.sample(dist)
    }
}

async fn pipelined(spec: &str, prompt: &str, max_tokens: &str, options: &[&str]) -> Outcome {
    let mut paths = Vec::new();
    for path in ["pipelined", "stepwise"] {
        let mut chosen = sampler(spec)?;
        let mut ctx = Context::new();
        ctx.fill(prompt);
        let start = ctx.len();
        let stop = stop(max_tokens, options)?;
        let text_out = if path == "pipelined" {
            ctx.generate(chosen.as_mut(), &stop).await?
        } else {
            ctx.generate(&mut Stepwise(chosen.as_mut()), &stop).await?
        };
        let forwarded = ctx.len() - ctx.num_pending();
        let rng = chosen.server_spec().and_then(|spec| spec.rng).map_or("null".to_string(), |rng| rng.state().to_string());
        let generated = ints(&ctx.token_ids()[start..]);
        let (tokens, pending) = (ints(&ctx.token_ids()[..forwarded]), ints(&ctx.token_ids()[forwarded..]));
        let num_pages = ctx.page_handles().len().to_string();
        let more = ctx.generate_tokens(chosen.as_mut(), &Stop::max_tokens(3).without_eos()).await?;
        let after = ctx.next_dist(5).await?;
        paths.push(object(&[("text", text(&text_out)), ("generated", generated), ("tokens", tokens),
                            ("pending", pending), ("num_pages", num_pages), ("rng", rng), ("more", ints(&more)),
                            ("dist", dist(&after))]));
    }
    Ok(object(&[("pipelined", paths[0].clone()), ("stepwise", paths[1].clone())]))
}

async fn dists(prompt: &str, k: &str) -> Outcome {
    let mut ctx = Context::new();
    ctx.fill(prompt);
    let dists = ctx.dists(number(k)?).await?;
    Ok(object(&[("token_ids", list(dists.iter().map(|d| ints(&d.token_ids))))]))
}

async fn adapter(name: &str, prompt: &str, max_tokens: &str) -> Outcome {
    let adapter_id = oven::open_adapter(name)?;
    let mut adapted = Context::new().with_adapter(adapter_id);
    let mut base = Context::new();
    adapted.fill(prompt);
    base.fill(prompt);
    adapted.flush().await?;
    let forked = adapted.fork().await?;
    let mut contexts = vec![adapted, forked, base];
    let stop = &Stop::max_tokens(number(max_tokens)?);
    let generated =
        join_all(contexts.iter_mut().map(|ctx| async move { ctx.generate_tokens(&mut Greedy, stop).await })).await;
    let tokens = generated.into_iter().collect::<Result<Vec<_>, String>>()?;
    let missing = match oven::open_adapter("no-such-adapter") {
        Ok(_) => "null".to_string(),
        Err(message) => text(&message),
    };
    Ok(object(&[
        ("id", adapter_id.to_string()),
        ("adapted", ints(&tokens[0])),
        ("forked", ints(&tokens[1])),
        ("base", ints(&tokens[2])),
        ("missing", missing),
    ]))
}

fn vectors() -> Outcome {
    let mut rng = Rng::new(1234567);
    let u64s: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
    let mut rng = Rng::new(42);
    let f64s: Vec<String> = (0..3).map(|_| rng.next_f64().to_string()).collect();
    let d = Distribution { token_ids: vec![0, 1, 2, 3, 4], probs: vec![0.4, 0.3, 0.15, 0.1, 0.05] };
    let samplers: Vec<(&str, Box<dyn Sampler>)> = vec![
        ("temperature-1", Box::new(Temperature::new(1.0, 7))),
        ("temperature-0.7", Box::new(Temperature::new(0.7, 7))),
        ("top-k", Box::new(TopK::new(3, 1.5, 7))),
        ("top-p", Box::new(TopP::new(0.8, 0.7, 7))),
        ("min-p", Box::new(MinP::new(0.3, 1.0, 7))),
        ("temperature-0", Box::new(Temperature::new(0.0, 7))),
    ];
    let draws: Vec<(&str, String)> = samplers
        .into_iter()
        .map(|(name, mut s)| (name, text(&(0..20).map(|_| s.sample(&d).to_string()).collect::<String>())))
        .collect();
    Ok(object(&[("u64", ints(&u64s)), ("f64", format!("[{}]", f64s.join(","))), ("draws", object(&draws))]))
}

fn grammar(spec: &str) -> Result<Option<Grammar>, String> {
    let (kind, text) = match spec.find(':') {
        Some(at) => (&spec[..at], &spec[at + 1..]),
        None => (spec, ""),
    };
    Ok(Some(match kind {
        "none" => return Ok(None),
        "json" => Grammar::json()?,
        "json-schema" => Grammar::json_schema(text)?,
        "regex" => Grammar::regex(text)?,
        "lark" => Grammar::lark(text)?,
        "choice" => Grammar::choice(&text.split(',').collect::<Vec<&str>>())?,
        _ => return Err(format!("unknown grammar {:?}", spec)),
    }))
}

fn bias_of(spec: &str) -> Result<Vec<(u32, f32)>, String> {
    let mut bias = Vec::new();
    for item in spec.split(',').filter(|item| !item.is_empty()) {
        let (token, value) = item.split_at(item.find(':').ok_or_else(|| format!("bad bias {:?}", item))?);
        bias.push((number(token)?, number(&value[1..])?));
    }
    Ok(bias)
}

fn ids_of(spec: &str) -> Result<Vec<u32>, String> {
    spec.split(',').filter(|token| !token.is_empty()).map(number).collect()
}

fn logprobs_json(ctx: &Context) -> String {
    list(ctx.logprobs().iter().map(|lp| {
        let top = list(lp.top.iter().map(|(id, logprob)| format!("[{},{}]", id, *logprob as f64)));
        format!("[{},{},{}]", lp.token, lp.logprob as f64, top)
    }))
}

fn rng_state(chosen: &mut dyn Sampler) -> String {
    chosen.server_spec().and_then(|spec| spec.rng).map_or("null".to_string(), |rng| rng.state().to_string())
}

async fn shaped(spec: &str, prompt: &str, max_tokens: &str, grammar_spec: &str, options: &[&str]) -> Outcome {
    let field = |name: &str| options.iter().find_map(|o| o.strip_prefix(name));
    let penalties: Vec<f64> = field("penalties=").unwrap_or("0:0:1").split(':').map(number).collect::<Result<_, _>>()?;
    let mut chosen = sampler(spec)?;
    let g = grammar(grammar_spec)?;
    let mut shape = Shape::new()
        .with_presence_penalty(penalties[0])
        .with_frequency_penalty(penalties[1])
        .with_repetition_penalty(penalties[2])
        .with_logprobs(number(field("logprobs=").unwrap_or("-1"))?);
    if let Some(g) = &g {
        shape = shape.with_grammar(g);
    }
    if let Some(ids) = field("allowed=") {
        shape = shape.with_allowed(&ids_of(ids)?);
    }
    for (token, value) in bias_of(field("bias=").unwrap_or(""))? {
        shape = shape.with_bias(token, value);
    }
    let mut ctx = Context::new();
    ctx.fill(prompt);
    let start = ctx.len();
    let text_out = ctx.generate_shaped(chosen.as_mut(), &stop(max_tokens, options)?, &shape).await?;
    let (tokens, logprobs, pages) = (ints(&ctx.token_ids()[start..]), logprobs_json(&ctx), handles(&ctx));
    let rng = rng_state(chosen.as_mut());
    let more = ctx.generate_tokens(&mut Greedy, &Stop::max_tokens(3).without_eos()).await?;
    drop(ctx);
    drop(shape);
    drop(g); // the grammar's last holder: dropped on the server after the context, as Python does
    Ok(object(&[("tokens", tokens), ("text", text(&text_out)), ("logprobs", logprobs), ("pages", pages),
                ("rng", rng), ("more", ints(&more))]))
}

async fn masked(spec: &str, prompt: &str, steps: &str, ids: &str, bias: &str, logprobs: &str) -> Outcome {
    let mut chosen = sampler(spec)?;
    let allowed = ids_of(ids)?;
    let bias = bias_of(bias)?;
    let mut ctx = Context::new();
    ctx.fill(prompt);
    let mut tokens: Vec<u32> = Vec::new();
    for _ in 0..number::<usize>(steps)? {
        let left: Vec<u32> = allowed.iter().cloned().filter(|t| !tokens.contains(t)).collect();
        let mut shape = Shape::new().with_allowed(&left).with_logprobs(number(logprobs)?);
        for (token, value) in &bias {
            shape = shape.with_bias(*token, *value);
        }
        tokens.push(ctx.shaped_step(&shape, chosen.as_mut()).await?);
    }
    Ok(object(&[("tokens", ints(&tokens)), ("logprobs", logprobs_json(&ctx)), ("pages", handles(&ctx)),
                ("rng", rng_state(chosen.as_mut()))]))
}

async fn shape_errors() -> Outcome {
    let mut messages = Vec::new();
    let attempts: [(&str, fn() -> Result<Grammar, String>); 3] = [
        ("kind", || Grammar::new("xml", "<a/>")),
        ("regex", || Grammar::regex("(")),
        ("choice", || Grammar::choice::<&str>(&[])),
    ];
    for (name, attempt) in attempts.iter() {
        if let Err(message) = attempt() {
            messages.push((*name, text(&message)));
        }
    }
    let mut ctx = Context::new();
    ctx.fill("one two three");
    let mut greedy = Greedy;
    let mut stepwise = Stepwise(&mut greedy);
    if let Err(message) = ctx.generate_shaped(&mut stepwise, &Stop::max_tokens(2), &Shape::new()).await {
        messages.push(("custom", text(&message)));
    }
    let shapes = [
        ("allowed", Shape::new().with_allowed(&[oven::vocab_size()])),
        ("presence", Shape::new().with_presence_penalty(5.0)),
    ];
    for (name, shape) in shapes.iter() {
        if let Err(message) = ctx.generate_shaped(&mut Greedy, &Stop::max_tokens(2), shape).await {
            messages.push((*name, text(&message)));
        }
    }
    if let Err(message) = ctx.shaped_step(&Shape::new().with_repetition_penalty(1.2), &mut Greedy).await {
        messages.push(("step", text(&message)));
    }
    messages.push(("pages", handles(&ctx)));
    Ok(object(&messages))
}

async fn errors() -> Outcome {
    let mut messages = Vec::new();
    let mut ctx = Context::new();
    if let Err(message) = ctx.next_dist(0).await {
        messages.push(("empty", text(&message)));
    }
    ctx.fill("one two three");
    let len = ctx.len();
    if let Err(message) = ctx.drop_range(0, len).await {
        messages.push(("range", text(&message)));
    }
    drop(ctx);
    if let Err(message) = Context::imported("conformance/none", &[1, 2]) {
        messages.push(("import", text(&message)));
    }
    Ok(object(&messages))
}

async fn launch(program: &str, prompt: &str, max: &str) -> Outcome {
    let finished = oven::launch(program, &[prompt, max])?;
    let cancelled = oven::launch(program, &[prompt, max])?;
    cancelled.cancel()?;
    let mut fields = Vec::new();
    for (name, child) in [("finished", &finished), ("cancelled", &cancelled)] {
        let exit = child.wait().await?;
        fields.push((name, object(&[("state", text(&exit.state)), ("code", exit.code.to_string()),
                                    ("error", text(&exit.error)), ("messages", list(exit.messages.iter().map(|m| text(m))))])));
    }
    if let Err(message) = oven::launch("no-such-program", &[]) {
        fields.push(("refused", text(&message)));
    }
    Ok(object(&fields))
}

async fn scenario(arg: &str) -> Outcome {
    let fields: Vec<&str> = arg.split('|').collect();
    match (fields[0], &fields[1..]) {
        ("generate", [spec, prompt, max, options @ ..]) => generate(spec, prompt, max, options).await,
        ("steps", [spec, prompt, max]) => steps(spec, prompt, max).await,
        ("fork", [prompt, n, max]) => fork(prompt, n, max).await,
        ("drop", [prompt, start, end]) => drop_range(prompt, start, end).await,
        ("share", [prompt, max]) => share(prompt, max).await,
        ("snapshot", [prompt, more, max]) => snapshot(prompt, more, max).await,
        ("truncate", [prompt, max, keep]) => truncate(prompt, max, keep).await,
        ("kv", [prompt, steps, max, mode]) => kv(prompt, steps, max, mode).await,
        ("ahead", [prompt, max, token]) => ahead(prompt, max, token).await,
        ("pipelined", [spec, prompt, max, options @ ..]) => pipelined(spec, prompt, max, options).await,
        ("dists", [prompt, k]) => dists(prompt, k).await,
        ("adapter", [name, prompt, max]) => adapter(name, prompt, max).await,
        ("vectors", []) => vectors(),
        ("errors", []) => errors().await,
        ("launch", [program, prompt, max]) => launch(program, prompt, max).await,
        ("shaped", [spec, prompt, max, grammar, options @ ..]) => shaped(spec, prompt, max, grammar, options).await,
        ("masked", [spec, prompt, steps, ids, bias, n]) => masked(spec, prompt, steps, ids, bias, n).await,
        ("shape_errors", []) => shape_errors().await,
        _ => Err(format!("unknown scenario {:?}", arg)),
    }
}

async fn main(args: Vec<String>) -> Result<(), String> {
    for arg in &args {
        oven::send(&scenario(arg).await?);
    }
    Ok(())
}

oven::main!(main);
