//! [`PageTable`]: a context's KvPage handles, with reference counts for pages shared by forks.
//!
//! Page handles belong to the instance, not to a context: a fork holds the same handles as its
//! parent for the pages they share. Each page carries an `Rc` cloned into every table that
//! holds it, so its strong count is the number of contexts holding it; the last one to let go
//! deallocates it. The `Rc` holds whether the page is exported (ours, published under a name)
//! or imported (another's export): other instances read it, so it is shared for good. A shared
//! page is immutable: a context that must write into one (after `truncate`, or to mask tokens)
//! copies it first.

use std::cell::Cell;
use std::rc::Rc;

#[derive(Default)]
pub(crate) struct PageTable {
    handles: Vec<u32>,
    /// Per page: its holders, and whether an export shares it.
    holders: Vec<Rc<Cell<bool>>>,
}

impl PageTable {
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    pub fn handles(&self) -> &[u32] {
        &self.handles
    }

    pub fn push(&mut self, handle: u32) {
        self.handles.push(handle);
        self.holders.push(Rc::default());
    }

    /// Mark the first `count` pages as shared with an export (exported or imported).
    pub fn mark_exported(&mut self, count: usize) {
        self.holders[..count].iter().for_each(|h| h.set(true));
    }

    /// True if another context or an export holds page `index` too.
    pub fn is_shared(&self, index: usize) -> bool {
        Rc::strong_count(&self.holders[index]) > 1 || self.holders[index].get()
    }

    /// A table holding the first `count` pages of this one, shared.
    pub fn share_prefix(&self, count: usize) -> PageTable {
        PageTable { handles: self.handles[..count].to_vec(), holders: self.holders[..count].to_vec() }
    }

    /// Put a fresh page in place of page `index`; return the old handle if no other context
    /// holds it (an export keeps its pages whether or not we hold a handle on them).
    pub fn replace(&mut self, index: usize, handle: u32) -> Option<u32> {
        let old = self.handles[index];
        let exclusive = Rc::strong_count(&self.holders[index]) == 1;
        self.handles[index] = handle;
        self.holders[index] = Rc::default();
        if exclusive {
            Some(old)
        } else {
            None
        }
    }

    /// Keep the first `count` pages; return the handles let go that nobody else holds.
    pub fn truncate(&mut self, count: usize) -> Vec<u32> {
        if count >= self.handles.len() {
            return Vec::new();
        }
        let holders = self.holders.split_off(count);
        let handles = self.handles.split_off(count);
        handles.into_iter().zip(holders).filter(|(_, holder)| Rc::strong_count(holder) == 1).map(|(h, _)| h).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(handles: &[u32]) -> PageTable {
        let mut t = PageTable::default();
        for h in handles {
            t.push(*h);
        }
        t
    }

    #[test]
    fn shared_pages_are_freed_by_the_last_holder() {
        let mut parent = table(&[1, 2, 3]);
        let mut child = parent.share_prefix(2);
        child.push(9);
        assert!(parent.is_shared(0) && parent.is_shared(1) && !parent.is_shared(2));
        assert_eq!(parent.truncate(0), vec![3]); // 1 and 2 are still the child's
        assert!(!child.is_shared(0));
        assert_eq!(child.truncate(0), vec![1, 2, 9]);
    }

    #[test]
    fn replacing_a_shared_page_keeps_it_for_the_other_holder() {
        let mut parent = table(&[1, 2]);
        let child = parent.share_prefix(2);
        assert_eq!(parent.replace(1, 7), None);
        assert_eq!(parent.handles(), &[1, 7]);
        assert!(!child.is_shared(1));
        assert_eq!(parent.replace(1, 8), Some(7));
        assert_eq!(parent.truncate(5), Vec::<u32>::new());
    }

    #[test]
    fn exported_pages_stay_shared_but_are_freed_by_their_last_holder() {
        let mut parent = table(&[1, 2, 3]);
        parent.mark_exported(2);
        let mut child = parent.share_prefix(2);
        assert!(parent.is_shared(0) && parent.is_shared(1) && !parent.is_shared(2));
        assert_eq!(parent.truncate(0), vec![3]);
        assert!(child.is_shared(0) && child.is_shared(1)); // still exported
        assert_eq!(child.replace(1, 7), Some(2)); // our handle on the export is let go
        assert!(!child.is_shared(1));
        assert_eq!(child.truncate(0), vec![1, 7]);
    }
}
