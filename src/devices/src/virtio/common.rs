//! What every virtio device keeps whatever its type and transport: its type, the features
//! offered and accepted, the queues' sizes and notification eventfds, its configuration
//! space, and once the driver has started it, the queues, guest memory and interrupt. A
//! device embeds one [`VirtioCommon`] and the [`super::VirtioDevice`] trait's provided
//! methods do the rest.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use telemetry::DeviceMetrics;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueState, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::{ActivateError, GuestMemory, Interrupt, InterruptKind};

/// A started device's queues, in the order the device defines, with guest memory and the
/// interrupt that tells the driver about used buffers.
#[derive(Debug)]
pub struct Active {
    pub mem: GuestMemory,
    pub queues: Vec<Queue>,
    pub irq: Arc<dyn Interrupt>,
}

/// One request as a device finds it: the driver's chain of buffers in guest memory.
pub type Chain<'a> = DescriptorChain<&'a GuestMemory>;

impl Active {
    /// Serves every chain the driver made available on `queue`, in order: `serve` says
    /// how many bytes it wrote into each (the used length), or None to leave that chain in
    /// the ring for later (a rate limiter's wait) and stop. The driver is interrupted once
    /// if any chain was given back; true if any was.
    pub fn serve_queue(
        &mut self,
        queue: usize,
        mut serve: impl FnMut(&GuestMemory, Chain<'_>) -> Option<u32>,
    ) -> bool {
        let mut used_any = false;
        let q = &mut self.queues[queue];
        while let Some(chain) = q.pop_descriptor_chain(&self.mem) {
            let head = chain.head_index();
            let Some(used_len) = serve(&self.mem, chain) else {
                q.go_to_previous_position();
                break;
            };
            if q.add_used(&self.mem, head, used_len).is_err() {
                log::debug!("virtio: the used ring of queue {queue} cannot be written");
            }
            used_any = true;
        }
        if used_any {
            self.notify(queue);
        }
        used_any
    }

    /// The same, unless the driver asked not to be told (VRING_AVAIL_F_NO_INTERRUPT, or
    /// its used-event index with EVENT_IDX).
    pub fn notify_if_wanted(&mut self, queue: usize) {
        if self.queues[queue]
            .needs_notification(&self.mem)
            .unwrap_or(true)
        {
            self.notify(queue);
        }
    }

    /// Tells the driver that the used ring of `queue` moved.
    pub fn notify(&self, queue: usize) {
        if let Err(e) = self.irq.trigger(InterruptKind::Queue(queue as u16)) {
            log::debug!("virtio: cannot raise the interrupt: {e}");
        }
    }
}

#[derive(Debug)]
pub struct VirtioCommon {
    /// The virtio device ID (2 for block, ...).
    device_type: u32,
    avail_features: u64,
    acked_features: u64,
    queue_max_sizes: Vec<u16>,
    queue_events: Vec<EventFd>,
    /// What the driver reads at the configuration space's offsets (past its end: zeros).
    config_space: Vec<u8>,
    /// Changes with the configuration space, so that the driver can tell a torn read.
    config_generation: u32,
    metrics: Arc<dyn DeviceMetrics>,
    /// Taken by a device while it works on its queues, and put back.
    pub active: Option<Active>,
}

impl VirtioCommon {
    /// A device of `device_type` that offers `avail_features`, has one queue of each size
    /// in `queue_max_sizes` and an empty configuration space, and counts in `metrics`.
    pub fn new(
        device_type: u32,
        avail_features: u64,
        queue_max_sizes: &[u16],
        metrics: Arc<dyn DeviceMetrics>,
    ) -> std::io::Result<Self> {
        let queue_events = queue_max_sizes
            .iter()
            .map(|_| EventFd::new(libc::EFD_NONBLOCK))
            .collect::<std::io::Result<_>>()?;
        Ok(VirtioCommon {
            device_type,
            avail_features,
            acked_features: 0,
            queue_max_sizes: queue_max_sizes.to_vec(),
            queue_events,
            config_space: Vec::new(),
            config_generation: 0,
            metrics,
            active: None,
        })
    }

    /// The same device with `space` as its configuration space.
    pub fn with_config_space(mut self, space: Vec<u8>) -> Self {
        self.config_space = space;
        self
    }

    pub fn device_type(&self) -> u32 {
        self.device_type
    }

    pub fn config_space(&self) -> &[u8] {
        &self.config_space
    }

    /// The device changed its configuration: see [`VirtioCommon::config_changed`].
    pub fn set_config_space(&mut self, space: Vec<u8>) {
        self.config_space = space;
        self.config_changed();
    }

    /// The configuration changed (here, or in a device that keeps its own): a new
    /// generation, and a configuration-change interrupt if a driver is there to take it.
    pub fn config_changed(&mut self) {
        self.config_generation = self.config_generation.wrapping_add(1);
        if let Some(active) = &self.active {
            if let Err(e) = active.irq.trigger(InterruptKind::Config) {
                log::debug!("virtio: cannot raise the configuration interrupt: {e}");
            }
        }
    }

    pub fn config_generation(&self) -> u32 {
        self.config_generation
    }

    pub fn avail_features(&self) -> u64 {
        self.avail_features
    }

    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Whether the driver accepted feature `bit`.
    pub fn acked(&self, bit: u32) -> bool {
        self.acked_features & (1 << bit) != 0
    }

    /// Keeps what the driver accepted of what was offered.
    pub fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features;
    }

    pub fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_max_sizes
    }

    pub fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    pub fn queue_event(&self, index: usize) -> &EventFd {
        &self.queue_events[index]
    }

    /// The queue whose notification eventfd is `fd`, with its notification consumed: what a
    /// device's event handler asks first.
    pub fn notified_queue(&self, fd: RawFd) -> Option<usize> {
        let index = self.queue_events.iter().position(|e| e.as_raw_fd() == fd)?;
        let _ = self.queue_events[index].read();
        Some(index)
    }

    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// Takes the driver's queues if there is one per queue size and each lies in guest
    /// memory (a queue that does not is counted in the device's `activate_fails`).
    pub fn activate(
        &mut self,
        mem: GuestMemory,
        queues: Vec<Queue>,
        irq: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        let expected = self.queue_max_sizes.len();
        if queues.len() != expected {
            return Err(ActivateError::QueueCount {
                expected,
                found: queues.len(),
            });
        }
        if let Some(bad) = queues.iter().position(|q| !q.is_valid(&mem)) {
            self.metrics.activate_fails().inc();
            return Err(ActivateError::InvalidQueue(bad));
        }
        self.active = Some(Active { mem, queues, irq });
        Ok(())
    }

    /// Signals the notification eventfds of `queues`, so that the VMM thread serves what
    /// the driver posted before KVM's ioeventfds were armed (activation runs on a vCPU
    /// thread, whose seccomp filter allows no device I/O).
    pub fn kick(&self, queues: impl IntoIterator<Item = usize>) {
        for index in queues {
            if let Some(evt) = self.queue_events.get(index) {
                let _ = evt.write(1);
            }
        }
    }

    /// Back to the state before the driver started the device.
    pub fn reset(&mut self) {
        self.active = None;
        self.acked_features = 0;
    }

    /// The started device's queues, in order (empty before activation).
    pub fn queue_states(&self) -> Vec<QueueState> {
        self.active
            .iter()
            .flat_map(|a| a.queues.iter().map(Queue::state))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use virtio_queue::desc::split::Descriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use super::*;

    /// Records what it was asked to raise.
    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<InterruptKind>>);

    impl Interrupt for Recorder {
        fn trigger(&self, kind: InterruptKind) -> std::io::Result<()> {
            self.0.lock().unwrap().push(kind);
            Ok(())
        }
    }

    #[test]
    fn serving_a_queue_interrupts_for_that_queue_once() {
        let mem: GuestMemory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let idle = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let busy = MockSplitQueue::create(&mem, GuestAddress(0x10000), 16);
        for i in 0..2u16 {
            let d = RawDescriptor::from(Descriptor::new(0x40000 + 64 * u64::from(i), 64, 2, 0));
            busy.desc_table().store(i, d).unwrap();
            busy.avail().ring().ref_at(usize::from(i)).unwrap().store(i);
        }
        busy.avail().idx().store(2);
        let irq = Arc::new(Recorder::default());
        let mut active = Active {
            mem: mem.clone(),
            queues: vec![idle.create_queue().unwrap(), busy.create_queue().unwrap()],
            irq: irq.clone(),
        };
        assert!(active.serve_queue(1, |_, _| Some(8)));
        assert!(!active.serve_queue(0, |_, _| Some(8)));
        assert_eq!(*irq.0.lock().unwrap(), vec![InterruptKind::Queue(1)]);
    }

    #[test]
    fn a_refused_activation_is_counted_and_a_configuration_change_interrupts_the_driver() {
        let mem: GuestMemory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let metrics = Arc::new(telemetry::BlockMetrics::default());
        let mut common = VirtioCommon::new(2, 0, &[16], metrics.clone())
            .unwrap()
            .with_config_space(vec![1, 2]);
        let irq = Arc::new(Recorder::default());
        // A descriptor table past the end of guest memory is not valid.
        let mut bad: Queue = MockSplitQueue::create(&mem, GuestAddress(0), 16)
            .create_queue()
            .unwrap();
        bad.set_desc_table_address(Some(2 << 20), Some(0));
        let refused = common.activate(mem.clone(), vec![bad], irq.clone());
        assert!(matches!(refused, Err(ActivateError::InvalidQueue(0))));
        assert_eq!(metrics.activate_fails.take(), 1);
        common.set_config_space(vec![3, 4]);
        assert_eq!(common.config_generation(), 1, "changed before activation");
        assert!(irq.0.lock().unwrap().is_empty(), "no driver to tell yet");
        let good = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        common
            .activate(mem.clone(), vec![good.create_queue().unwrap()], irq.clone())
            .unwrap();
        common.set_config_space(vec![5, 6]);
        assert_eq!(
            (common.config_space(), common.config_generation()),
            (&[5u8, 6][..], 2)
        );
        assert_eq!(*irq.0.lock().unwrap(), vec![InterruptKind::Config]);
        assert_eq!(metrics.activate_fails.take(), 0);
    }

    #[test]
    fn a_notification_names_its_queue_and_is_consumed() {
        let metrics = Arc::new(telemetry::VsockMetrics::default());
        let common = VirtioCommon::new(19, 0, &[16, 16, 16], metrics).unwrap();
        common.queue_event(2).write(1).unwrap();
        assert_eq!(
            common.notified_queue(common.queue_event(2).as_raw_fd()),
            Some(2)
        );
        // Consumed: the eventfd (non-blocking) has nothing left to read.
        assert!(common.queue_event(2).read().is_err());
        assert_eq!(common.notified_queue(-1), None);
    }
}
