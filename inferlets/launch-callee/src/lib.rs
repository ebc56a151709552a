//! launch-callee: the child `inferlets/launch-caller` launches (Pie's launch-callee), on the Rust SDK.
//!
//! Arguments: PROMPT K [--hold]. Greedy-generates at most K tokens after PROMPT (stopping at an end
//! token) and sends the text as one message: to its parent, when a parent launched it, as well as to
//! any client attached to it. With --hold it then waits for a client message before it exits (so a
//! test can end its parent while it still runs).

use oven::{Context, Greedy, Stop};

const USAGE: &str = "usage: launch-callee PROMPT K [--hold]";

async fn main(args: Vec<String>) -> Result<(), String> {
    let hold = args.iter().any(|a| a == "--hold");
    let rest: Vec<&String> = args.iter().filter(|a| *a != "--hold").collect();
    if rest.len() != 2 {
        return Err(USAGE.to_string());
    }
    let max_tokens: usize = rest[1].parse().map_err(|_| format!("bad K {:?}; {}", rest[1], USAGE))?;
    let mut ctx = Context::new();
    ctx.fill(rest[0]);
    let text = ctx.generate(&mut Greedy, &Stop::max_tokens(max_tokens).with_eos()).await?;
    oven::send(&text);
    if hold {
        oven::receive().await?;
    }
    Ok(())
}

oven::main!(main);
