//! `oven:inferlet/messaging`: messages to the client and between instances.

#[link(wasm_import_module = "oven:inferlet/messaging@0.2.0")]
extern "C" {
    #[link_name = "send"]
    fn raw_send(ptr: *const u8, len: usize);
    #[link_name = "receive"]
    fn raw_receive() -> u32;
    #[link_name = "broadcast"]
    fn raw_broadcast(topic_ptr: *const u8, topic_len: usize, msg_ptr: *const u8, msg_len: usize);
    #[link_name = "subscribe"]
    fn raw_subscribe(topic_ptr: *const u8, topic_len: usize) -> u32;
}

/// To the client that launched the instance.
pub fn send(message: &str) {
    unsafe { raw_send(message.as_ptr(), message.len()) }
}

/// A future for the next client message (take-text).
pub fn receive() -> u32 {
    unsafe { raw_receive() }
}

/// To every instance subscribed to `topic`.
pub fn broadcast(topic: &str, message: &str) {
    unsafe { raw_broadcast(topic.as_ptr(), topic.len(), message.as_ptr(), message.len()) }
}

/// A future for the next message broadcast on `topic` (take-text).
pub fn subscribe(topic: &str) -> u32 {
    unsafe { raw_subscribe(topic.as_ptr(), topic.len()) }
}
