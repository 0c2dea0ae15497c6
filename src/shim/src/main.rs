//! `containerd-shim-ember-v2`: containerd's runtime v2 shim (runtime type
//! `io.containerd.ember.v2`) that runs each sandbox's OCI containers in one Ember microVM,
//! through the guest agent's container service (docs/containers.md).

mod agent;
mod config;
mod events;
mod http;
mod layers;
mod network;
mod process;
mod sandbox;
mod shim;
mod task;
mod template;

fn main() {
    containerd_shim::run::<shim::EmberShim>("io.containerd.ember.v2", None);
}
