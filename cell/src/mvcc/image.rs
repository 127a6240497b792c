//! The keyspace as a snapshot holds it: every key with every version kept.
//!
//! The bytes are those the cell has always written (a version as
//! `{mod_revision, sub, kv: Option<KeyValue>}`, the key repeated in each
//! `KeyValue`), so snapshots and backups written by earlier builds open,
//! and theirs by this one. In memory a version no longer carries its key
//! ([`super::versions`]), so the image is written from borrowed parts and
//! read one key at a time into the memory form.

use super::keyspace::KeyValue;
use super::versions::{Record, Version, Versions};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::Arc;

/// Everything needed to rebuild a keyspace; the snapshot format.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeySpaceImage {
    pub revision: i64,
    pub compact_revision: i64,
    pub keys: Vec<KeyHistory>,
}

/// One key and its versions, oldest first.
#[derive(Debug, Clone)]
pub struct KeyHistory {
    pub key: Arc<[u8]>,
    pub versions: Versions,
}

/// A version as the image writes it.
#[derive(Serialize)]
struct VersionOut<'a> {
    mod_revision: i64,
    sub: u32,
    kv: Option<KvOut<'a>>,
}

#[derive(Serialize)]
struct KvOut<'a> {
    #[serde(with = "serde_bytes")]
    key: &'a [u8],
    #[serde(with = "serde_bytes")]
    value: &'a [u8],
    create_revision: i64,
    mod_revision: i64,
    version: i64,
    lease: i64,
}

/// A version as the image reads it.
#[derive(Deserialize)]
struct VersionIn {
    mod_revision: i64,
    sub: u32,
    kv: Option<KeyValue>,
}

impl Serialize for KeyHistory {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct All<'a>(&'a KeyHistory);
        impl Serialize for All<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let key = &self.0.key;
                serializer.collect_seq(self.0.versions.iter().map(|v| VersionOut {
                    mod_revision: v.mod_revision,
                    sub: v.sub,
                    kv: v.view(key).map(|kv| KvOut {
                        key: kv.key,
                        value: kv.value,
                        create_revision: kv.create_revision,
                        mod_revision: kv.mod_revision,
                        version: kv.version,
                        lease: kv.lease,
                    }),
                }))
            }
        }
        let mut pair = serializer.serialize_tuple(2)?;
        pair.serialize_element(serde_bytes::Bytes::new(&self.key))?;
        pair.serialize_element(&All(self))?;
        pair.end()
    }
}

impl<'de> Deserialize<'de> for KeyHistory {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (key, versions): (serde_bytes::ByteBuf, Vec<VersionIn>) =
            Deserialize::deserialize(deserializer)?;
        let versions = versions
            .into_iter()
            .map(|v| Version {
                mod_revision: v.mod_revision,
                sub: v.sub,
                record: v.kv.map(|kv| {
                    Arc::new(Record {
                        create_revision: kv.create_revision,
                        version: kv.version,
                        lease: kv.lease,
                        value: kv.value.into_boxed_slice(),
                    })
                }),
            })
            .collect();
        Ok(KeyHistory {
            key: Arc::from(key.into_vec()),
            versions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::keyspace::KeySpace;
    use crate::storage::codec::{decode, encode};

    /// The layout every earlier build wrote: a version held its whole
    /// key-value.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct EarlierVersion {
        mod_revision: i64,
        sub: u32,
        kv: Option<KeyValue>,
    }

    type EarlierImage = (i64, i64, Vec<(Vec<u8>, Vec<EarlierVersion>)>);

    fn kv(key: &[u8], value: &[u8], create: i64, rev: i64, version: i64) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            value: value.to_vec(),
            create_revision: create,
            mod_revision: rev,
            version,
            lease: 7,
        }
    }

    fn earlier() -> EarlierImage {
        let version = |rev, sub, kv| EarlierVersion {
            mod_revision: rev,
            sub,
            kv,
        };
        (
            4,
            0,
            vec![
                (
                    b"a".to_vec(),
                    vec![
                        version(2, 0, Some(kv(b"a", b"one", 2, 2, 1))),
                        version(3, 1, Some(kv(b"a", b"two", 2, 3, 2))),
                        version(4, 0, None),
                    ],
                ),
                (
                    b"b".to_vec(),
                    vec![version(3, 0, Some(kv(b"b", b"", 3, 3, 1)))],
                ),
            ],
        )
    }

    #[test]
    fn an_image_written_by_an_earlier_build_opens_and_is_written_back_byte_for_byte() {
        let bytes = encode(&earlier()).expect("encode");
        let image: KeySpaceImage = decode(&bytes).expect("the earlier layout decodes");
        let keys = KeySpace::from_image(image.clone());
        assert_eq!(keys.revision(), 4);
        assert_eq!(keys.live_keys(), 1);
        let b = keys.get(b"b").expect("b is live");
        assert_eq!((b.value, b.create_revision, b.lease), (&b""[..], 3, 7));
        assert!(keys.get(b"a").is_none());
        assert_eq!(encode(&image).expect("encode"), bytes);
        assert_eq!(encode(&keys.image()).expect("encode"), bytes);
        let back: EarlierImage = decode(&bytes).expect("decode");
        assert_eq!(back, earlier());
    }
}
