//! Everything that talks to NATS: the connection, the stream and pipelined publishing, and
//! the claim that gives each stream one source, and the Object Store bucket that holds
//! payloads too large for a message.

pub mod api_error;
pub mod claim;
pub mod connect;
pub mod credentials;
pub mod durability;
pub mod handshake;
pub mod large_payloads;
pub mod low_water;
pub mod monitor;
pub mod outbound;
pub mod publisher;
pub mod server_version;
pub mod wire;
