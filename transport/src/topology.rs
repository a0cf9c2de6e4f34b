//! GPU and NIC locality from hwloc (through `hwlocality`): for a GPU, the CPUs and NUMA nodes
//! near it and the network devices nearest to it; and pinning the process to those CPUs.
//!
//! GPUs are NVIDIA display-class PCI devices, numbered in PCI bus order (what CUDA calls
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID`), or named by bus id (`"0000:65:00.0"`). Machines without
//! GPUs or without PCI information get [`Locality::Unknown`] with the reason, never a panic.
//!
//! ```
//! use transport::topology::{GpuRef, Locality, Topology};
//! let topo = Topology::load().unwrap();
//! match topo.gpu(GpuRef::Index(0)) {
//!     Locality::Known(gpu) => println!("GPU {} near CPUs {:?}, NICs {:?}", gpu.pci, gpu.cpus, gpu.nics),
//!     Locality::Unknown(why) => println!("no GPU locality: {why}"),
//! }
//! ```

use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::OSDeviceType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;

use crate::{Error, Result};

/// Which GPU.
#[derive(Debug, Clone, Copy)]
pub enum GpuRef<'a> {
    /// The n-th NVIDIA GPU in PCI bus order.
    Index(usize),
    /// A PCI bus id, `domain:bus:device.function` or `bus:device.function` (hex).
    BusId(&'a str),
}

/// A network device and how far it is from a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    /// The OS name (`eth0`, `mlx5_0`, ...).
    pub name: String,
    /// Whether it is an RDMA (OpenFabrics) device rather than a plain network interface.
    pub rdma: bool,
    /// Steps in the hwloc tree from the GPU to the NIC through their closest common
    /// ancestor: smaller is nearer (same PCIe switch < same NUMA node < same machine).
    pub hops: usize,
}

/// What is near one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLocality {
    /// The GPU's PCI bus id.
    pub pci: String,
    /// CPUs near the GPU, in hwloc's list format (`"0-15"`).
    pub cpus: String,
    /// NUMA nodes near the GPU (`"0"`).
    pub numa_nodes: String,
    /// Network devices, nearest first.
    pub nics: Vec<Nic>,
}

/// A GPU's locality, or why it is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locality {
    /// Found in the topology.
    Known(GpuLocality),
    /// No such GPU, no PCI information, ...
    Unknown(String),
}

/// The machine's topology, with I/O devices.
#[derive(Debug)]
pub struct Topology {
    topo: hwlocality::Topology,
}

fn topo_err(e: impl std::fmt::Display) -> Error {
    Error::Topology(format!("hwloc: {e}"))
}

/// hwloc's list format (`0-3,8`) of a CPU or node set (whose `Display` wraps it as
/// `CpuSet(0-3,8)`).
fn list(set: impl std::fmt::Display) -> String {
    let s = set.to_string();
    match (s.find('('), s.ends_with(')')) {
        (Some(open), true) => s[open + 1..s.len() - 1].to_string(),
        _ => s,
    }
}

fn pci_id(obj: &TopologyObject) -> Option<String> {
    match obj.attributes() {
        Some(ObjectAttributes::PCIDevice(p)) => Some(format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            p.domain(),
            p.bus_id(),
            p.bus_device(),
            p.function()
        )),
        _ => None,
    }
}

fn is_nvidia_gpu(obj: &TopologyObject) -> bool {
    matches!(obj.attributes(), Some(ObjectAttributes::PCIDevice(p))
        if p.vendor_id() == 0x10de && p.class_id() >> 8 == 0x03)
}

/// Steps from `a` up to the closest ancestor it shares with `b`, plus steps from `b` up to it.
fn hops(a: &TopologyObject, b: &TopologyObject) -> Option<usize> {
    let up_a: Vec<&TopologyObject> = std::iter::once(a).chain(a.ancestors()).collect();
    for (j, x) in std::iter::once(b).chain(b.ancestors()).enumerate() {
        if let Some(i) = up_a.iter().position(|y| std::ptr::eq(*y, x)) {
            return Some(i + j);
        }
    }
    None
}

impl Topology {
    /// Discovers the machine, keeping the I/O devices that matter (GPUs, NICs, bridges).
    pub fn load() -> Result<Topology> {
        let topo = hwlocality::Topology::builder()
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(topo_err)?
            .build()
            .map_err(topo_err)?;
        Ok(Topology { topo })
    }

    /// PCI bus ids of the NVIDIA GPUs, in bus order.
    pub fn gpus(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .topo
            .pci_devices()
            .filter(|o| is_nvidia_gpu(o))
            .filter_map(pci_id)
            .collect();
        ids.sort();
        ids
    }

    /// Network and RDMA devices the topology knows.
    pub fn network_devices(&self) -> Vec<String> {
        self.topo
            .os_devices()
            .filter(|o| Self::nic_kind(o).is_some())
            .filter_map(|o| o.name().map(|n| n.to_string_lossy().into_owned()))
            .collect()
    }

    fn nic_kind(obj: &TopologyObject) -> Option<bool> {
        match obj.attributes() {
            Some(ObjectAttributes::OSDevice(d)) => match d.device_type() {
                OSDeviceType::Network => Some(false),
                OSDeviceType::OpenFabrics => Some(true),
                _ => None,
            },
            _ => None,
        }
    }

    /// The locality of one GPU.
    pub fn gpu(&self, which: GpuRef<'_>) -> Locality {
        let obj = match which {
            GpuRef::Index(n) => {
                let ids = self.gpus();
                let Some(id) = ids.get(n) else {
                    return Locality::Unknown(format!(
                        "no GPU with index {n} ({} NVIDIA GPUs in the PCI topology)",
                        ids.len()
                    ));
                };
                self.topo
                    .pci_devices()
                    .find(|o| pci_id(o).as_deref() == Some(id.as_str()))
            }
            GpuRef::BusId(id) => match self.topo.pci_device_by_bus_id_string(id) {
                Ok(found) => found,
                Err(_) => return Locality::Unknown(format!("{id:?} is not a PCI bus id")),
            },
        };
        let Some(obj) = obj else {
            return Locality::Unknown(format!("{which:?}: not in the PCI topology"));
        };
        let Some(anchor) = obj.first_non_io_ancestor() else {
            return Locality::Unknown("the GPU has no CPU-side ancestor".into());
        };
        let cpus = anchor.cpuset().map(list).unwrap_or_default();
        let numa_nodes = anchor.nodeset().map(list).unwrap_or_default();
        let mut nics: Vec<Nic> = self
            .topo
            .os_devices()
            .filter_map(|o| {
                let rdma = Self::nic_kind(o)?;
                Some(Nic {
                    name: o.name()?.to_string_lossy().into_owned(),
                    rdma,
                    hops: hops(obj, o)?,
                })
            })
            .collect();
        nics.sort_by(|a, b| (a.hops, !a.rdma, &a.name).cmp(&(b.hops, !b.rdma, &b.name)));
        Locality::Known(GpuLocality {
            pci: pci_id(obj).unwrap_or_default(),
            cpus,
            numa_nodes,
            nics,
        })
    }

    /// Pins this process to the CPUs near `gpu`.
    pub fn pin_near(&self, gpu: &GpuLocality) -> Result<()> {
        let set = parse_cpu_list(&gpu.cpus)?;
        self.topo
            .bind_cpu(&set, CpuBindingFlags::PROCESS)
            .map_err(topo_err)?;
        tracing::info!(cpus = %gpu.cpus, gpu = %gpu.pci, "pinned near the GPU");
        Ok(())
    }

    /// The CPUs this process may run on (hwloc list format).
    pub fn allowed_cpus(&self) -> String {
        list(self.topo.cpuset())
    }
}

/// Parses hwloc's list format (`"0-3,8,10-11"`) into a CPU set.
fn parse_cpu_list(list: &str) -> Result<hwlocality::cpu::cpuset::CpuSet> {
    let bad = || Error::Topology(format!("{list:?} is not a CPU list like \"0-3,8\""));
    let mut set = hwlocality::cpu::cpuset::CpuSet::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let a: usize = a.parse().map_err(|_| bad())?;
                let b: usize = b.parse().map_err(|_| bad())?;
                if a > b || b > 1 << 20 {
                    return Err(bad());
                }
                set.set_range(a..=b);
            }
            None => set.set(part.parse::<usize>().map_err(|_| bad())?),
        }
    }
    if set.is_empty() {
        return Err(bad());
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(list(parse_cpu_list("0-3,8").unwrap()), "0-3,8");
        assert_eq!(list(parse_cpu_list("5").unwrap()), "5");
        for bad in ["", "x", "3-1", "1-", "0-99999999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad}");
        }
    }

    /// Works on any machine: a missing GPU is `Unknown` with a reason, and bad bus ids too.
    #[test]
    fn gpu_locality_degrades_to_unknown() {
        let topo = Topology::load().unwrap();
        let n = topo.gpus().len();
        match topo.gpu(GpuRef::Index(n)) {
            Locality::Unknown(why) => assert!(why.contains("no GPU with index"), "{why}"),
            other => panic!("{other:?}"),
        }
        match topo.gpu(GpuRef::BusId("not-a-bus-id")) {
            Locality::Unknown(why) => assert!(why.contains("not a PCI bus id"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            topo.gpu(GpuRef::BusId("ffff:ff:1f.7")),
            Locality::Unknown(_)
        ));
        for (i, id) in topo.gpus().iter().enumerate() {
            let Locality::Known(g) = topo.gpu(GpuRef::Index(i)) else {
                panic!("GPU {id} listed but not found");
            };
            assert_eq!(&g.pci, id);
            assert!(!g.cpus.is_empty());
            assert!(g.nics.windows(2).all(|w| w[0].hops <= w[1].hops));
        }
        assert!(!topo.allowed_cpus().is_empty());
    }

    /// Pinning to the CPUs we already have works and leaves them unchanged.
    #[test]
    fn pinning_to_a_cpu_set() {
        let topo = Topology::load().unwrap();
        let all = topo.allowed_cpus();
        let here = GpuLocality {
            pci: "none".into(),
            cpus: all.clone(),
            numa_nodes: String::new(),
            nics: Vec::new(),
        };
        topo.pin_near(&here).unwrap();
        assert_eq!(Topology::load().unwrap().allowed_cpus(), all);
    }
}
