//! The MMDS data store: one JSON document that the host replaces (PUT) or merges into (PATCH,
//! RFC 7396), bounded in size, and the V1/V2 rules under which the guest may read it.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::token::{TokenError, TokenTable};

/// Firecracker's default limit, the API's default payload limit.
pub const DEFAULT_LIMIT: usize = 51_200;

/// `mmds-config.version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum Version {
    /// Requests need no token (a valid or invalid one is accepted too).
    #[default]
    V1,
    /// Every GET needs a session token from `PUT /latest/api/token`.
    V2,
}

/// How the guest wants a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    /// EC2 IMDS text: an object's keys one per line (objects with a trailing '/'), a string
    /// as itself.
    Imds,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("The MMDS data store is {size} bytes as JSON, more than its limit of {limit} bytes.")]
    TooLarge { size: usize, limit: usize },
    #[error("The MMDS data store is not initialized.")]
    NotInitialized,
    #[error("The MMDS resource does not exist.")]
    NotFound,
    #[error("Cannot retrieve value. The value has an unsupported type.")]
    UnsupportedType,
    #[error(transparent)]
    Token(#[from] TokenError),
}

#[derive(Debug)]
pub struct DataStore {
    data: Option<Value>,
    limit: usize,
    version: Version,
    imds_compat: bool,
    tokens: TokenTable,
}

impl Default for DataStore {
    fn default() -> Self {
        DataStore::new(DEFAULT_LIMIT)
    }
}

impl DataStore {
    /// An empty store that holds at most `limit` bytes of JSON.
    pub fn new(limit: usize) -> Self {
        DataStore {
            data: None,
            limit,
            version: Version::V1,
            imds_compat: false,
            tokens: TokenTable::default(),
        }
    }

    pub fn configure(&mut self, version: Version, imds_compat: bool) {
        self.version = version;
        self.imds_compat = imds_compat;
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn imds_compat(&self) -> bool {
        self.imds_compat
    }

    fn check_size(&self, value: &Value) -> Result<(), StoreError> {
        let size = serde_json::to_vec(value)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > self.limit {
            return Err(StoreError::TooLarge {
                size,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// `PUT /mmds`: replaces the document.
    pub fn put(&mut self, value: Value) -> Result<(), StoreError> {
        self.check_size(&value)?;
        self.data = Some(value);
        Ok(())
    }

    /// `PATCH /mmds`: merges `patch` into the document, all or nothing.
    pub fn patch(&mut self, patch: &Value) -> Result<(), StoreError> {
        let mut value = self.data.clone().ok_or(StoreError::NotInitialized)?;
        merge_patch(&mut value, patch);
        self.check_size(&value)?;
        self.data = Some(value);
        Ok(())
    }

    /// `GET /mmds`: the document, or `{}` before the first PUT.
    pub fn document(&self) -> Value {
        self.data
            .clone()
            .unwrap_or_else(|| Value::Object(Default::default()))
    }

    /// The value at `path` (a URL path, read as a JSON pointer; a trailing '/' is ignored).
    pub fn get(&self, path: &str, format: Format) -> Result<String, StoreError> {
        let data = self.data.as_ref().ok_or(StoreError::NotFound)?;
        let pointer = path.strip_suffix('/').unwrap_or(path);
        let value = data.pointer(pointer).ok_or(StoreError::NotFound)?;
        match format {
            Format::Json => Ok(value.to_string()),
            Format::Imds => imds_text(value),
        }
    }

    pub fn issue_token(&mut self, ttl_seconds: u32, now: Instant) -> Result<String, StoreError> {
        Ok(self.tokens.issue(ttl_seconds, now)?)
    }

    pub fn token_is_valid(&self, token: &str, now: Instant) -> bool {
        self.tokens.is_valid(token, now)
    }
}

fn imds_text(value: &Value) -> Result<String, StoreError> {
    match value {
        Value::Object(map) => Ok(map
            .iter()
            .map(|(k, v)| match v.is_object() {
                true => format!("{k}/"),
                false => k.clone(),
            })
            .collect::<Vec<_>>()
            .join("\n")),
        Value::String(s) => Ok(s.clone()),
        _ => Err(StoreError::UnsupportedType),
    }
}

/// RFC 7396: objects merge key by key, `null` removes a key, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(map) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            map.remove(key);
        } else {
            merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn store() -> DataStore {
        let mut s = DataStore::default();
        s.put(json!({
            "latest": {"meta-data": {"ami-id": "ami-1", "net": {"mac": "aa"}}},
            "n": 5,
        }))
        .unwrap();
        s
    }

    #[test]
    fn paths_read_as_json_or_imds() {
        let s = store();
        assert_eq!(s.get("/latest", Format::Imds).unwrap(), "meta-data/");
        assert_eq!(
            s.get("/latest/meta-data/", Format::Imds).unwrap(),
            "ami-id\nnet/"
        );
        assert_eq!(
            s.get("/latest/meta-data/ami-id", Format::Imds).unwrap(),
            "ami-1"
        );
        assert_eq!(
            s.get("/latest/meta-data/ami-id", Format::Json).unwrap(),
            "\"ami-1\""
        );
        assert_eq!(s.get("/n", Format::Json).unwrap(), "5");
        assert_eq!(s.get("/n", Format::Imds), Err(StoreError::UnsupportedType));
        assert_eq!(s.get("/nope", Format::Json), Err(StoreError::NotFound));
        assert!(s.get("/", Format::Json).unwrap().starts_with("{\"latest\""));
        assert_eq!(
            DataStore::default().get("/", Format::Json),
            Err(StoreError::NotFound)
        );
    }

    #[test]
    fn patch_merges_and_removes() {
        let mut s = store();
        s.patch(&json!({"latest": {"meta-data": {"ami-id": "ami-2", "net": null}}, "x": [1]}))
            .unwrap();
        assert_eq!(
            s.document(),
            json!({"latest": {"meta-data": {"ami-id": "ami-2"}}, "n": 5, "x": [1]})
        );
        assert_eq!(
            DataStore::default().patch(&json!({})),
            Err(StoreError::NotInitialized)
        );
    }

    #[test]
    fn the_limit_holds_for_put_and_patch() {
        let mut s = DataStore::new(40);
        s.put(json!({"a": "x"})).unwrap();
        let big = json!({"b": "y".repeat(40)});
        assert!(matches!(
            s.put(big.clone()),
            Err(StoreError::TooLarge { .. })
        ));
        assert!(matches!(s.patch(&big), Err(StoreError::TooLarge { .. })));
        assert_eq!(s.document(), json!({"a": "x"}));
    }
}
