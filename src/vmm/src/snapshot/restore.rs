//! `PUT /snapshot/load`, once the request is checked ([`super::load`]): guest RAM from the
//! memory file or the page-fault handler, then the same devices and vCPUs in their saved
//! state, and the MMDS's data. The result is a [`MicroVm`] ready to start.

use super::load::{LoadError, Memory, Prepared, SnapshotLoadParams};
use super::uffd;
use crate::builder::{self, Host};
use crate::memory;
use crate::microvm::MicroVm;
use crate::resources::VmResources;

/// The snapshot's microVM, paused unless `params.resume_vm`, and the configuration it was
/// rebuilt from (the snapshot's, overrides applied).
pub fn restore(
    params: &SnapshotLoadParams,
    prepared: Prepared,
    host: &Host,
) -> Result<(MicroVm, VmResources), LoadError> {
    let Prepared {
        state,
        mut resources,
        memory,
    } = prepared;
    let huge_pages = resources.machine_config.huge_pages;
    let (mem, uffd) = match &memory {
        Memory::File(file) => (memory::from_file(file, &state.memory)?, None),
        Memory::Uffd(path) => {
            let mem = memory::create_regions(&state.memory, huge_pages)?;
            let backend = uffd::hand_over(&mem, huge_pages, path)?;
            (mem, Some(backend))
        }
    };
    let mut vm = builder::restore(
        &resources,
        &state,
        mem,
        params.dirty_tracking(),
        params.clock_realtime,
        host,
    )?;
    if let Some(uffd) = uffd {
        vm.keep_uffd(uffd);
    }
    if !params.resume_vm {
        vm.start_paused();
    }
    if !state.mmds.is_null() {
        mmds::lock(host.mmds).put(state.mmds.clone())?;
    }
    resources.machine_config.track_dirty_pages = params.dirty_tracking();
    Ok((vm, resources))
}
