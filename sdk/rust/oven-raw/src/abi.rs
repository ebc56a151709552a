//! Canonical-ABI plumbing shared by every interface module: guest allocation for the host,
//! return areas, and taking ownership of lists the host wrote into guest memory.

use std::alloc::{self, Layout};
use std::cell::UnsafeCell;
use std::marker::PhantomData;

/// The allocator the host calls to copy lists and strings into this instance's memory (and to
/// pass `resume` its argument). Same contract as wit-bindgen's: `(0, 0, align, n)` allocates,
/// anything else reallocates; a zero-sized request gets a dangling, aligned pointer.
///
/// # Safety
/// Called only by the host, with a pointer/size pair it got from an earlier call.
#[no_mangle]
pub unsafe extern "C" fn cabi_realloc(old_ptr: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    let layout;
    let ptr = if old_len == 0 {
        if new_len == 0 {
            return align as *mut u8;
        }
        layout = Layout::from_size_align_unchecked(new_len, align);
        alloc::alloc(layout)
    } else {
        layout = Layout::from_size_align_unchecked(old_len, align);
        alloc::realloc(old_ptr, layout, new_len)
    };
    if ptr.is_null() {
        alloc::handle_alloc_error(layout);
    }
    ptr
}

/// A flattened `list<T>`: the `(ptr, len)` pair of the ABI, also the in-memory layout of a list
/// field (8 bytes, align 4 on wasm32).
#[repr(C)]
pub struct RawList<T> {
    pub ptr: *mut T,
    pub len: usize,
}

impl<T> RawList<T> {
    /// Borrow a slice as a list parameter; the host only reads it during the call.
    pub fn borrow(items: &[T]) -> Self {
        RawList { ptr: items.as_ptr() as *mut T, len: items.len() }
    }

    /// Take ownership of a list the host allocated with [`cabi_realloc`] using `T`'s size and
    /// alignment, which is exactly the layout `Vec<T>` with capacity `len` frees with.
    ///
    /// # Safety
    /// `ptr`/`len` must come from the host as a freshly lifted `list<T>`, taken at most once.
    pub unsafe fn into_vec(self) -> Vec<T> {
        if self.len == 0 {
            return Vec::new(); // the pointer may be dangling or null: never free it
        }
        Vec::from_raw_parts(self.ptr, self.len, self.len)
    }
}

impl RawList<u8> {
    /// Take ownership of a `string` the host wrote (UTF-8, align 1).
    ///
    /// # Safety
    /// As for [`RawList::into_vec`].
    pub unsafe fn into_string(self) -> String {
        String::from_utf8(self.into_vec()).expect("the host passed a string that is not UTF-8")
    }
}

/// A borrowed `string` parameter in the list layout (for `list<string>` arguments).
pub fn borrow_str(text: &str) -> RawList<u8> {
    RawList::borrow(text.as_bytes())
}

/// Stack space the host writes a multi-value result into. 32 bytes, align 4, covers every
/// result in this world: the largest is `result<child-exit, string>` (tag at 0, state at 4, code
/// at 12, error at 16, messages at 24: 32 bytes).
#[repr(C, align(4))]
pub struct RetArea {
    bytes: [u8; 32],
    _not_send: PhantomData<*mut u8>,
}

impl RetArea {
    pub fn new() -> Self {
        RetArea { bytes: [0; 32], _not_send: PhantomData }
    }

    pub fn ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }

    pub fn u8_at(&self, offset: usize) -> u8 {
        self.bytes[offset]
    }

    pub fn u16_at(&self, offset: usize) -> u16 {
        u16::from_le_bytes([self.bytes[offset], self.bytes[offset + 1]])
    }

    pub fn u32_at(&self, offset: usize) -> u32 {
        let b = &self.bytes[offset..offset + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    pub fn f32_at(&self, offset: usize) -> f32 {
        f32::from_bits(self.u32_at(offset))
    }

    /// The list at `offset` (a `(ptr, len)` pair), taken into a `Vec`.
    ///
    /// # Safety
    /// The host must have written a `list<T>` there; take it at most once.
    pub unsafe fn take_list<T>(&self, offset: usize) -> Vec<T> {
        RawList { ptr: self.u32_at(offset) as usize as *mut T, len: self.u32_at(offset + 4) as usize }.into_vec()
    }

    /// # Safety
    /// As for [`RetArea::take_list`], for a `string`.
    pub unsafe fn take_string(&self, offset: usize) -> String {
        RawList { ptr: self.u32_at(offset) as usize as *mut u8, len: self.u32_at(offset + 4) as usize }.into_string()
    }

    /// The `list<string>` at `offset`, each string taken too.
    ///
    /// # Safety
    /// As for [`RetArea::take_list`].
    pub unsafe fn take_string_list(&self, offset: usize) -> Vec<String> {
        self.take_list::<RawList<u8>>(offset).into_iter().map(|s| s.into_string()).collect()
    }

    /// Lift a `result<T, string>`: tag byte at 0, payload at 4; `ok` lifts the payload.
    ///
    /// # Safety
    /// The host must have written a `result<T, string>` here; take it at most once.
    pub unsafe fn take_result<T>(&self, ok: impl FnOnce(&Self) -> T) -> Result<T, String> {
        match self.u8_at(0) {
            0 => Ok(ok(self)),
            _ => Err(self.take_string(4)),
        }
    }
}

impl Default for RetArea {
    fn default() -> Self {
        Self::new()
    }
}

/// Where an export's `list<u32>` result goes: the ABI returns one pointer to `(ptr, len)`, and
/// the memory must outlive the call until the host calls the post-return hook, so it is static.
/// Exports never overlap (one instance runs one call at a time), so one area is enough.
struct ReturnArea(UnsafeCell<[usize; 2]>);

// wasm32-unknown-unknown is single-threaded; the area is touched only by exports and their
// post-return hooks, which the host calls one after another.
unsafe impl Sync for ReturnArea {}

static RETURN_AREA: ReturnArea = ReturnArea(UnsafeCell::new([0; 2]));

/// Hand `items` to the host as an export's `list<u32>` result; freed by [`free_returned_list_u32`].
pub fn return_list_u32(items: Vec<u32>) -> *mut u8 {
    let items = items.into_boxed_slice(); // capacity == len, so the free below has the right layout
    let len = items.len();
    let ptr = Box::into_raw(items) as *mut u32;
    let area = RETURN_AREA.0.get();
    unsafe { *area = [ptr as usize, len] };
    area as *mut u8
}

/// Post-return hook body: the host has copied the result out; free it.
///
/// # Safety
/// `ret` must be the pointer the matching export returned, freed once.
pub unsafe fn free_returned_list_u32(ret: *mut u8) {
    let [ptr, len] = *(ret as *const [usize; 2]);
    drop(RawList { ptr: ptr as *mut u32, len }.into_vec());
}
