//! The fresh-read memo: per object, the resourceVersion of the newest copy this process
//! wrote or read from the API server.
//!
//! The watch cache lags behind the operator's own writes. A reconcile takes the cache's
//! copy when it is the version remembered here (or nothing is remembered), else reads the
//! object with one GET. Most reconciles are triggered by the watch event of the newest
//! version, so this saves a GET per reconcile; a copy still behind an external write is
//! safe too, as every status write carries the resourceVersion it was decided on and
//! conflicts if stale.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Mutex;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use super::{Error, kube_err};

/// Entries kept before pruning against the cache is considered.
const PRUNE_FLOOR: usize = 1024;

/// The newest resourceVersion per object of kind `K` in one namespace.
pub struct Fresh<K: Resource<DynamicType = ()> + 'static> {
    namespace: String,
    newest: Mutex<HashMap<String, String>>,
    /// The running controller's cache (set at each start): entries for objects no longer
    /// in it are dropped now and then.
    store: Mutex<Option<Store<K>>>,
}

impl<K> Fresh<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + 'static,
{
    /// An empty memo for objects in `namespace`.
    pub fn new(namespace: String) -> Self {
        Fresh {
            namespace,
            newest: Mutex::new(HashMap::new()),
            store: Mutex::new(None),
        }
    }

    /// The watch cache of the controller now running.
    pub fn set_store(&self, store: Store<K>) {
        *self.store.lock().unwrap_or_else(|e| e.into_inner()) = Some(store);
    }

    /// Whether `cached` (the watch cache's copy of `name`) is older than what this process
    /// last wrote or read.
    pub fn is_stale(&self, name: &str, cached: &K) -> bool {
        let newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        newest
            .get(name)
            .is_some_and(|rv| cached.meta().resource_version.as_ref() != Some(rv))
    }

    /// The object to decide on: `cached` unless [`Fresh::is_stale`], else a GET through
    /// `api` (`None`: the object is gone).
    pub async fn get(&self, api: &Api<K>, name: &str, cached: &K) -> Result<Option<K>, Error> {
        if !self.is_stale(name, cached) {
            return Ok(Some(cached.clone()));
        }
        let obj = api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("reading {} {name}", K::kind(&()))))?;
        match &obj {
            Some(o) => self.remember(name, o),
            None => self.forget(name),
        }
        Ok(obj)
    }

    /// `obj` was written or read: its version is the newest.
    pub fn remember(&self, name: &str, obj: &K) {
        let Some(rv) = &obj.meta().resource_version else {
            return;
        };
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        newest.insert(name.to_string(), rv.clone());
        // Objects deleted by someone else are never reconciled again: drop their entries
        // once the map has grown well past the cache (amortised O(1) per write).
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(store) = store.as_ref()
            && newest.len() > PRUNE_FLOOR.max(2 * store.len())
        {
            let ns = &self.namespace;
            newest.retain(|n, _| store.get(&ObjectRef::new(n).within(ns)).is_some());
        }
    }

    /// `name` is gone or deleted.
    pub fn forget(&self, name: &str) {
        self.newest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// Objects remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.newest.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
