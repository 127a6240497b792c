//! What the fuzz targets share: reading structure out of libFuzzer's bytes
//! ([`Input`]), the requests a state machine applies ([`requests`]), a live
//! one-member cell behind a proxy ([`live`]) and a gRPC codec that sends a
//! message's bytes as they are ([`raw_codec`]).

pub mod input;
pub mod live;
pub mod raw_codec;
pub mod requests;

pub use input::Input;
