//! The JSON shapes of the HTTP API and the one rule for bytes in JSON:
//! a key or value is a UTF-8 string when its bytes are UTF-8, base64
//! otherwise, and the `*_encoding` field beside it says which.

use base64::Engine;
use latchkey_shared::etcdpb::{PbKeyValue, PbRangeResponse};
use latchkey_shared::{ApiError, LeaseId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How a key or value is written in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// The bytes are UTF-8 and written as they are.
    #[default]
    Utf8,
    /// The bytes are not UTF-8: standard base64 with padding.
    Base64,
}

/// Bytes as JSON text, with the encoding used.
pub fn encode(bytes: &[u8]) -> (String, Encoding) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_string(), Encoding::Utf8),
        Err(_) => (
            base64::engine::general_purpose::STANDARD.encode(bytes),
            Encoding::Base64,
        ),
    }
}

/// JSON text back to bytes, by its encoding.
pub fn decode(text: &str, encoding: Encoding, what: &str) -> Result<Vec<u8>, ApiError> {
    match encoding {
        Encoding::Utf8 => Ok(text.as_bytes().to_vec()),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| ApiError::invalid(format!("{what} is not valid base64: {e}"))),
    }
}

/// A session (lease) id as the API writes it: 16 hex digits.
pub fn session_id(id: i64) -> String {
    LeaseId::from(id).to_string()
}

/// A session id from a path or a field.
pub fn parse_session(text: &str) -> Result<LeaseId, ApiError> {
    match text.parse::<LeaseId>() {
        Ok(LeaseId::NONE) => Err(ApiError::invalid("session 0 is no session")),
        Ok(id) => Ok(id),
        Err(e) => Err(ApiError::invalid(e.to_string())),
    }
}

/// The HTTP API speaks of sessions: a lease the cell does not know is a
/// session that has ended.
pub fn session_gone(e: ApiError) -> ApiError {
    match e.code {
        latchkey_shared::ErrorCode::LeaseNotFound => ApiError::new(
            latchkey_shared::ErrorCode::SessionExpired,
            format!("a session the request names has expired ({})", e.message),
        ),
        _ => e,
    }
}

/// One key with its value and metadata.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyValue {
    pub key: String,
    pub key_encoding: Encoding,
    /// Absent with `keys_only`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_encoding: Option<Encoding>,
    /// The revision that created the key (its fencing token when it is a
    /// lock's key).
    pub create_revision: i64,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// Changes since it was created (1 after the first put).
    pub version: i64,
    /// The session the key is bound to (deleted with it), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl KeyValue {
    pub fn from_pb(kv: &PbKeyValue, keys_only: bool) -> KeyValue {
        let (key, key_encoding) = encode(&kv.key);
        let (value, value_encoding) = if keys_only {
            (None, None)
        } else {
            let (v, e) = encode(&kv.value);
            (Some(v), Some(e))
        };
        KeyValue {
            key,
            key_encoding,
            value,
            value_encoding,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            session: (kv.lease != 0).then(|| session_id(kv.lease)),
        }
    }
}

/// The answer to a read.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RangeAnswer {
    /// The revision the answer reflects.
    pub revision: i64,
    /// How many keys match (all of them, even past `limit`).
    pub count: i64,
    /// True when `limit` cut the list short.
    pub more: bool,
    pub kvs: Vec<KeyValue>,
}

impl RangeAnswer {
    pub fn from_pb(resp: &PbRangeResponse, keys_only: bool) -> RangeAnswer {
        RangeAnswer {
            revision: resp.header.as_ref().map_or(0, |h| h.revision),
            count: resp.count,
            more: resp.more,
            kvs: resp
                .kvs
                .iter()
                .map(|kv| KeyValue::from_pb(kv, keys_only))
                .collect(),
        }
    }
}

/// The answer to a put.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PutAnswer {
    /// The revision of the write.
    pub revision: i64,
}

/// The answer to a delete.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeleteAnswer {
    /// The revision of the delete (the current one when nothing matched).
    pub revision: i64,
    /// How many keys were deleted.
    pub deleted: i64,
}

/// The error body of every failed request (DESIGN section 6).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The stable error code (`session_expired`, `compacted`, ...).
    pub error: String,
    pub message: String,
    /// `safe` (nothing happened: retry), `outcome_unknown` (it may have
    /// happened) or `never` (the same request gets the same answer).
    pub retry: String,
    /// With `compacted`: the oldest revision still readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compact_revision: Option<i64>,
    /// With `not_leader`: the leader's member id, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_stays_text_and_other_bytes_go_base64() {
        assert_eq!(encode(b"hello"), ("hello".to_string(), Encoding::Utf8));
        let (text, enc) = encode(&[0xff, 0x00, 0x41]);
        assert_eq!(enc, Encoding::Base64);
        assert_eq!(
            decode(&text, enc, "value").expect("round trip"),
            vec![0xff, 0x00, 0x41]
        );
        assert!(decode("not base64!", Encoding::Base64, "value").is_err());
    }

    #[test]
    fn session_ids_are_hex_both_ways() {
        assert_eq!(session_id(0x1f), "000000000000001f");
        assert_eq!(parse_session("1f").expect("hex").get(), 0x1f);
        assert!(parse_session("xyz").is_err());
        assert!(parse_session("0").is_err(), "0 means no session");
    }
}
