//! # tollgate-rls
//!
//! Envoy's rate-limit service API, `envoy.service.ratelimit.v3.RateLimitService`, as Rust types
//! (prost) and a tonic server and client, compiled at build time from tollgate's own `.proto`
//! subset in `proto/` (the packages, message names and field numbers of Envoy's, so that Envoy
//! and clients built from Envoy's protos speak to it unchanged). The modules mirror the protobuf
//! packages.

#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]

/// `envoy.*`
pub mod envoy {
    /// `envoy.config.*`
    pub mod config {
        /// `envoy.config.core.*`
        pub mod core {
            /// `envoy.config.core.v3`: header values.
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    /// `envoy.extensions.*`
    pub mod extensions {
        /// `envoy.extensions.common.*`
        pub mod common {
            /// `envoy.extensions.common.ratelimit.*`
            pub mod ratelimit {
                /// `envoy.extensions.common.ratelimit.v3`: descriptors.
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    /// `envoy.service.*`
    pub mod service {
        /// `envoy.service.ratelimit.*`
        pub mod ratelimit {
            /// `envoy.service.ratelimit.v3`: the service, its request and response.
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
    /// `envoy.type.*`
    pub mod r#type {
        /// `envoy.type.v3`: units.
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
        }
    }
}

pub use envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
pub use envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
pub use envoy::service::ratelimit::v3::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
pub use envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
