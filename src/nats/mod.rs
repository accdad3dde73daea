//! Everything that talks to NATS: the connection, the stream and pipelined publishing, and
//! the claim that gives each stream one source.

pub mod api_error;
pub mod claim;
pub mod connect;
pub mod credentials;
pub mod durability;
pub mod handshake;
pub mod low_water;
pub mod outbound;
pub mod publisher;
pub mod server_version;
pub mod wire;
