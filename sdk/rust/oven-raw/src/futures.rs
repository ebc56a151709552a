//! `oven:inferlet/futures`: poll futures and take their values (each value is taken once).

use crate::abi::{RawList, RetArea};

/// A top-K next-token distribution, most probable first.
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    pub token_ids: Vec<u32>,
    pub probs: Vec<f32>,
}

/// `distribution` as the host lays it out in memory: two lists, 16 bytes, align 4.
#[repr(C)]
struct RawDistribution {
    token_ids: RawList<u32>,
    probs: RawList<f32>,
}

/// A token drawn by `forward-sample-shaped`, with the model's own log-probabilities (log-softmax
/// over the whole vocabulary, before any shaping): `logprob` is NaN and the lists empty when none
/// were asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
    pub top_ids: Vec<u32>,
    pub top_logprobs: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// How a child instance ended (`children::wait_child`): `state` "finished", "failed" or "killed",
/// its exit code, why it did not finish ("" if it did), and the messages it sent, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildExit {
    pub state: String,
    pub code: i32,
    pub error: String,
    pub messages: Vec<String>,
}

#[link(wasm_import_module = "oven:inferlet/futures@0.2.0")]
extern "C" {
    #[link_name = "poll"]
    fn raw_poll(fs_ptr: *const u32, fs_len: usize, ret: *mut u8);
    #[link_name = "take-unit"]
    fn raw_take_unit(f: u32, ret: *mut u8);
    #[link_name = "take-handles"]
    fn raw_take_handles(f: u32, ret: *mut u8);
    #[link_name = "take-dists"]
    fn raw_take_dists(f: u32, ret: *mut u8);
    #[link_name = "take-token"]
    fn raw_take_token(f: u32, ret: *mut u8);
    #[link_name = "take-sampled"]
    fn raw_take_sampled(f: u32, ret: *mut u8);
    #[link_name = "take-text"]
    fn raw_take_text(f: u32, ret: *mut u8);
    #[link_name = "take-http"]
    fn raw_take_http(f: u32, ret: *mut u8);
    #[link_name = "take-exit"]
    fn raw_take_exit(f: u32, ret: *mut u8);
    #[link_name = "discard"]
    fn raw_discard(f: u32);
}

/// The futures among `fs` that have completed, without waiting.
pub fn poll(fs: &[u32]) -> Vec<u32> {
    let mut ret = RetArea::new();
    unsafe {
        raw_poll(fs.as_ptr(), fs.len(), ret.ptr());
        ret.take_list(0)
    }
}

/// Calls with no value (forward, embed-text, dealloc, sleep, ...).
pub fn take_unit(f: u32) -> Result<(), String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_take_unit(f, ret.ptr());
        ret.take_result(|_| ())
    }
}

/// alloc-kvpages and alloc-embeds: the new handles.
pub fn take_handles(f: u32) -> Result<Vec<u32>, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_take_handles(f, ret.ptr());
        ret.take_result(|r| r.take_list(4))
    }
}

/// get-next-dist (one) and forward-text (one per output index).
pub fn take_dists(f: u32) -> Result<Vec<Distribution>, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_take_dists(f, ret.ptr());
        ret.take_result(|r| {
            let raw: Vec<RawDistribution> = r.take_list(4);
            raw.into_iter()
                .map(|d| Distribution { token_ids: d.token_ids.into_vec(), probs: d.probs.into_vec() })
                .collect()
        })
    }
}

/// forward-sample: the token the server drew.
pub fn take_token(f: u32) -> Result<u32, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_take_token(f, ret.ptr());
        ret.take_result(|r| r.u32_at(4))
    }
}

/// forward-sample-shaped: the token, and its log-probabilities if they were asked for. In memory
/// the record sits at 4: token at 4, logprob at 8, top-ids at 12, top-logprobs at 20.
pub fn take_sampled(f: u32) -> Result<Sampled, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_take_sampled(f, ret.ptr());
        ret.take_result(|r| Sampled {
            token: r.u32_at(4),
            logprob: r.f32_at(8),
            top_ids: r.take_list(12),
            top_logprobs: r.take_list(20),
        })
    }
}

/// receive and subscribe: the message.
pub fn take_text(f: u32) -> Result<String, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_take_text(f, ret.ptr());
        ret.take_result(|r| r.take_string(4))
    }
}

/// fetch: the response. In memory the record sits at 4: status (u16) at 4, body at 8.
pub fn take_http(f: u32) -> Result<HttpResponse, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_take_http(f, ret.ptr());
        ret.take_result(|r| HttpResponse { status: r.u16_at(4), body: r.take_list(8) })
    }
}

/// wait-child: how the child ended. In memory the record sits at 4: state at 4, code at 12, error
/// at 16, messages at 24 (32 bytes, the whole return area).
pub fn take_exit(f: u32) -> Result<ChildExit, String> {
    let mut ret = RetArea::new();
    unsafe {
        raw_take_exit(f, ret.ptr());
        ret.take_result(|r| ChildExit {
            state: r.take_string(4),
            code: r.u32_at(12) as i32,
            error: r.take_string(16),
            messages: r.take_string_list(24),
        })
    }
}

/// Forget a future whose value is not wanted.
pub fn discard(f: u32) {
    unsafe { raw_discard(f) }
}
