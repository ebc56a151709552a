//! `oven:inferlet/queues`: command queues (queue 0 exists from the start).

#[link(wasm_import_module = "oven:inferlet/queues@0.2.0")]
extern "C" {
    #[link_name = "create-queue"]
    fn raw_create_queue(priority: u32) -> u32;
    #[link_name = "destroy-queue"]
    fn raw_destroy_queue(q: u32);
    #[link_name = "set-priority"]
    fn raw_set_priority(q: u32, priority: u32);
    #[link_name = "synchronize"]
    fn raw_synchronize(q: u32) -> u32;
}

pub fn create_queue(priority: u32) -> u32 {
    unsafe { raw_create_queue(priority) }
}

pub fn destroy_queue(q: u32) {
    unsafe { raw_destroy_queue(q) }
}

pub fn set_priority(q: u32, priority: u32) {
    unsafe { raw_set_priority(q, priority) }
}

/// A future that completes once every call issued on `q` before it has (take-unit).
pub fn synchronize(q: u32) -> u32 {
    unsafe { raw_synchronize(q) }
}
