//! Responses kept for `previous_response_id`, `GET /v1/responses/{id}` and `DELETE`: a bounded
//! map in memory (`--responses-store-size` entries), the least recently used dropped first. Lost
//! on restart, and each replica behind a load balancer has its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

use super::output::ResponseObject;

/// One stored response and the conversation it ended (chat messages, without `instructions`).
#[derive(Debug)]
pub struct Stored {
    /// The response, as returned.
    pub response: ResponseObject,
    /// Earlier turns, its input and its output, as chat messages.
    pub conversation: Vec<Value>,
}

/// The store (cheap to clone: shared).
#[derive(Clone, Debug)]
pub struct ResponseStore(Arc<Mutex<Inner>>);

#[derive(Debug)]
struct Inner {
    capacity: usize,
    /// Entries with the tick of their last use.
    entries: HashMap<String, (u64, Arc<Stored>)>,
    tick: u64,
}

impl ResponseStore {
    /// A store of at most `capacity` responses (0: none are kept).
    pub fn new(capacity: usize) -> Self {
        ResponseStore(Arc::new(Mutex::new(Inner {
            capacity,
            entries: HashMap::new(),
            tick: 0,
        })))
    }

    /// Whether responses are kept at all.
    pub fn is_enabled(&self) -> bool {
        self.lock().capacity > 0
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves a map that is still whole: keep using it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The response `id`, if kept (now the most recently used).
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        let mut inner = self.lock();
        inner.tick += 1;
        let tick = inner.tick;
        inner.entries.get_mut(id).map(|(used, stored)| {
            *used = tick;
            stored.clone()
        })
    }

    /// Keeps `stored`, dropping the least recently used response when full.
    pub fn put(&self, stored: Stored) {
        let mut inner = self.lock();
        if inner.capacity == 0 {
            return;
        }
        while inner.entries.len() >= inner.capacity {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => inner.entries.remove(&id),
                None => break,
            };
        }
        inner.tick += 1;
        let tick = inner.tick;
        let id = stored.response.id.clone();
        inner.entries.insert(id, (tick, Arc::new(stored)));
    }

    /// Forgets `id`; whether it was kept.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().entries.remove(id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(id: &str) -> Stored {
        let req: super::super::request::ResponsesRequest =
            serde_json::from_value(serde_json::json!({"input": "hi"})).unwrap();
        let mut response = ResponseObject::draft(&req, "m".into(), true);
        response.id = id.into();
        Stored {
            response,
            conversation: Vec::new(),
        }
    }

    #[test]
    fn keeps_the_most_recently_used() {
        let store = ResponseStore::new(2);
        store.put(stored("a"));
        store.put(stored("b"));
        assert!(store.get("a").is_some(), "a is now newer than b");
        store.put(stored("c"));
        assert!(store.get("b").is_none(), "b was the least recently used");
        assert!(store.get("a").is_some() && store.get("c").is_some());
        assert!(store.remove("a") && !store.remove("a"));
        let none = ResponseStore::new(0);
        none.put(stored("a"));
        assert!(none.get("a").is_none() && !none.is_enabled());
    }
}
