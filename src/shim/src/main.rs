//! `containerd-shim-ember-v2`: containerd's runtime v2 shim (runtime type
//! `io.containerd.ember.v2`) that runs each sandbox's OCI containers in one Ember microVM,
//! through the guest agent's container service (docs/containers.md).

mod agent;
mod config;
mod events;
mod host_mounts;
mod http;
mod layers;
mod metrics;
mod network;
mod process;
mod sandbox;
mod shim;
mod sys;
mod task;
mod template;

fn main() {
    // The shim waits for its own children (ember, mkfs.ext4, ip, tc): the library's reaper,
    // which waits for any child on SIGCHLD, would take their statuses first (ECHILD). Set
    // here, not in `Shim::new`: the library installs its signal handling before that.
    let config = containerd_shim::Config {
        no_reaper: true,
        no_sub_reaper: true,
        ..Default::default()
    };
    containerd_shim::run::<shim::EmberShim>("io.containerd.ember.v2", Some(config));
}
