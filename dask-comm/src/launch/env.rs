//! Which rank this process is, read from the variables launchers set.

use super::LaunchError;

/// The launcher that started this process, as its variables show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`).
    OpenMpi,
    /// A PMI launcher: MPICH's and Intel MPI's `mpiexec` (Hydra; `PMI_RANK`, `PMI_SIZE`).
    Pmi,
    /// A PMIx launcher (`PMIX_RANK`; the size from Slurm's or Open MPI's variables).
    Pmix,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`).
    Slurm,
}

/// This process's place in the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    /// Its rank, `0..size`.
    pub rank: u32,
    /// How many processes the job has.
    pub size: u32,
    /// Whether every rank runs on this host (so loopback reaches them all), when the
    /// launcher says.
    pub one_host: Option<bool>,
    /// How many ranks run on this host, when the launcher says.
    pub local_size: Option<u32>,
    /// Who started it.
    pub launcher: Launcher,
}

impl Rank {
    /// This process's rank, from its environment.
    pub fn from_env() -> Result<Rank, LaunchError> {
        Rank::from_vars(|name| std::env::var(name).ok())
    }

    /// The rank from the variables `var` gives (`None`: not set): Open MPI's first, then
    /// PMI's, PMIx's and Slurm's.
    ///
    /// ```
    /// use dask_comm::launch::{Launcher, Rank};
    /// let vars = [("PMI_RANK", "2"), ("PMI_SIZE", "6"), ("MPI_LOCALNRANKS", "6")];
    /// let var = |n: &str| vars.iter().find(|v| v.0 == n).map(|v| v.1.to_string());
    /// let r = Rank::from_vars(var).unwrap();
    /// assert_eq!((r.rank, r.size, r.launcher, r.one_host), (2, 6, Launcher::Pmi, Some(true)));
    /// ```
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Rank, LaunchError> {
        let number = |name: &'static str| -> Result<Option<u32>, LaunchError> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse::<u32>()
                        .map_err(|_| LaunchError::BadVariable {
                            name,
                            value: v.clone(),
                        })
                })
                .transpose()
        };
        let slurm_one_host = || -> Result<Option<bool>, LaunchError> {
            Ok(number("SLURM_NNODES")?
                .or(number("SLURM_JOB_NUM_NODES")?)
                .map(|n| n == 1))
        };
        let (rank, size, local_size, launcher) = if let Some(r) = number("OMPI_COMM_WORLD_RANK")? {
            let size = number("OMPI_COMM_WORLD_SIZE")?.ok_or(LaunchError::NoSize {
                variable: "OMPI_COMM_WORLD_SIZE",
            })?;
            (
                r,
                size,
                number("OMPI_COMM_WORLD_LOCAL_SIZE")?,
                Launcher::OpenMpi,
            )
        } else if let Some(r) = number("PMI_RANK")? {
            let size = number("PMI_SIZE")?.ok_or(LaunchError::NoSize {
                variable: "PMI_SIZE",
            })?;
            (r, size, number("MPI_LOCALNRANKS")?, Launcher::Pmi)
        } else if let Some(r) = number("PMIX_RANK")? {
            let size = number("SLURM_NTASKS")?
                .or(number("OMPI_COMM_WORLD_SIZE")?)
                .ok_or(LaunchError::NoSize {
                    variable: "SLURM_NTASKS",
                })?;
            (
                r,
                size,
                number("SLURM_NTASKS_PER_NODE").ok().flatten(),
                Launcher::Pmix,
            )
        } else if let Some(r) = number("SLURM_PROCID")? {
            let size =
                number("SLURM_NTASKS")?
                    .or(number("SLURM_NPROCS")?)
                    .ok_or(LaunchError::NoSize {
                        variable: "SLURM_NTASKS",
                    })?;
            (
                r,
                size,
                number("SLURM_NTASKS_PER_NODE").ok().flatten(),
                Launcher::Slurm,
            )
        } else {
            return Err(LaunchError::NotLaunched);
        };
        if rank >= size {
            return Err(LaunchError::BadRank { rank, size });
        }
        let one_host = match launcher {
            Launcher::Slurm | Launcher::Pmix => slurm_one_host()?,
            _ => None,
        }
        .or(local_size.map(|l| l == size));
        Ok(Rank {
            rank,
            size,
            one_host,
            local_size,
            launcher,
        })
    }
}

/// This job's identifier, from the variables of the launcher that started the ranks (the
/// same in every rank of a job, different between jobs), where it sets one: Open MPI's and
/// PMIx's namespace or job id, Slurm's job and step. MPICH's Hydra sets none. Under `mpirun`
/// inside a Slurm job, Slurm's variables differ between the ranks `mpirun` starts itself and
/// those it starts through `srun`, so they are read only when Slurm started the ranks.
pub(crate) fn job_id(launcher: Launcher, var: impl Fn(&str) -> Option<String>) -> Option<String> {
    let slurm = || {
        var("SLURM_JOB_ID")
            .map(|j| format!("slurm-{j}.{}", var("SLURM_STEP_ID").unwrap_or_default()))
    };
    let id = match launcher {
        Launcher::OpenMpi => [
            "PMIX_NAMESPACE",
            "OMPI_MCA_ess_base_jobid",
            "OMPI_MCA_orte_ess_jobid",
        ]
        .into_iter()
        .find_map(&var),
        Launcher::Pmix => var("PMIX_NAMESPACE").or_else(slurm),
        Launcher::Slurm => slurm(),
        Launcher::Pmi => None,
    };
    id.map(|j| {
        j.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(vars: &[(&str, &str)]) -> Result<Rank, LaunchError> {
        Rank::from_vars(|n| vars.iter().find(|v| v.0 == n).map(|v| v.1.to_string()))
    }

    #[test]
    fn every_launcher_is_read() {
        let r = rank(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap();
        assert_eq!(
            (r.rank, r.size, r.launcher, r.one_host),
            (0, 4, Launcher::OpenMpi, Some(false))
        );
        let r = rank(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
            ("SLURM_NNODES", "1"),
        ])
        .unwrap();
        assert_eq!(
            (r.rank, r.size, r.launcher, r.one_host),
            (5, 6, Launcher::Slurm, Some(true))
        );
        let r = rank(&[("PMIX_RANK", "1"), ("SLURM_NTASKS", "3")]).unwrap();
        assert_eq!(
            (r.rank, r.size, r.launcher, r.one_host),
            (1, 3, Launcher::Pmix, None)
        );
        // Open MPI's variables win over Slurm's (mpirun inside an allocation).
        let r = rank(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
        ])
        .unwrap();
        assert_eq!((r.rank, r.size), (3, 8));
    }

    #[test]
    fn wrong_variables_are_typed_errors() {
        assert!(matches!(rank(&[]), Err(LaunchError::NotLaunched)));
        assert!(matches!(
            rank(&[("PMI_RANK", "x"), ("PMI_SIZE", "3")]),
            Err(LaunchError::BadVariable {
                name: "PMI_RANK",
                ..
            })
        ));
        assert!(matches!(
            rank(&[("PMI_RANK", "1")]),
            Err(LaunchError::NoSize {
                variable: "PMI_SIZE"
            })
        ));
        assert!(matches!(
            rank(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "3")]),
            Err(LaunchError::BadRank { rank: 3, size: 3 })
        ));
    }

    #[test]
    fn job_ids_are_the_launchers_and_file_name_safe() {
        let id = |l: Launcher, vars: &[(&str, &str)]| {
            job_id(l, |n| {
                vars.iter().find(|v| v.0 == n).map(|v| v.1.to_string())
            })
        };
        let ompi_in_slurm = [
            ("PMIX_NAMESPACE", "prterun-host-123@1"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "0"),
        ];
        assert_eq!(
            id(Launcher::OpenMpi, &ompi_in_slurm).as_deref(),
            Some("prterun-host-123-1"),
            "mpirun inside a Slurm job: Open MPI's namespace, not Slurm's step"
        );
        assert_eq!(
            id(Launcher::Slurm, &ompi_in_slurm[1..]).as_deref(),
            Some("slurm-77.0")
        );
        assert_eq!(
            id(Launcher::Pmi, &ompi_in_slurm),
            None,
            "Hydra sets no job id"
        );
        assert_eq!(id(Launcher::OpenMpi, &[]), None);
    }
}
