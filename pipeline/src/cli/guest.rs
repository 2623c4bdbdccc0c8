//! The `phyfarm guest` verbs: the guest image, the QEMU machine, the guest
//! plan the farm starts from, and the variants a farm run covers.

use std::path::PathBuf;

use anyhow::Result;

use super::{jobs, print_stdout, GuestCommand};
use crate::config::{Paths, Variant};
use crate::guest::machine;
use crate::kbuild::images;
use crate::sandbox::runtime::{shell_quote, Runtime};
use crate::{progress, Outcome};

pub(super) fn run(paths: &Paths, runtime: Runtime, cmd: GuestCommand) -> Result<Outcome> {
    match cmd {
        GuestCommand::Machine { accel, json } => {
            let text = if json {
                serde_json::to_string(&machine::machine_description(accel))? + "\n"
            } else {
                shell_quote(&machine::machine_template(accel)) + "\n"
            };
            print_stdout(&text)?;
            Ok(Outcome::Pass)
        }
        GuestCommand::Plan {
            accel,
            kernel,
            artifacts,
            default_kernels,
            variant,
            image,
            emulator,
            build_emulator,
            exporter_kernel,
            build_exporter_kernel,
            device,
            json,
        } => {
            use crate::guest::plan;
            let variants = if variant.is_empty() {
                Variant::ALL.to_vec()
            } else {
                variant.clone()
            };
            let kernels = if default_kernels {
                plan::default_kernels(paths, runtime, &variants, jobs(None))?
            } else {
                given_kernels(kernel, artifacts, &variant, runtime)?
            };
            // What the device needs, then what was given or asked for.
            let mut req = plan::Request::for_farm(accel, kernels, device.as_deref());
            req.image = image;
            if device.is_none() {
                req.emulator = plan::Emulator::None;
            }
            if let Some(p) = emulator {
                req.emulator = plan::Emulator::Given(p);
            } else if build_emulator {
                req.emulator = plan::Emulator::Build;
            }
            if let Some(p) = exporter_kernel {
                req.exporter = plan::Exporter::Given(p);
            } else if build_exporter_kernel {
                req.exporter = plan::Exporter::Build { jobs: jobs(None) };
            }
            let p = plan::resolve(paths, runtime, &req)?;
            let text = if json {
                serde_json::to_string_pretty(&p)? + "\n"
            } else {
                let mut t = format!(
                    "guest image: {}\naccelerator: {} ({})\n",
                    p.guest_image.display(),
                    p.accel.name(),
                    p.accel_reason
                );
                for (v, k) in &p.kernels {
                    t += &format!("kernel {v}: {}\n", k.display());
                }
                if let Some(e) = &p.emulator {
                    t += &format!("emulator: {}\n", e.display());
                }
                if let Some(e) = &p.exporter_kernel {
                    t += &format!("exporter kernel: {}\n", e.display());
                }
                t + &format!("machine: {}\n", shell_quote(&p.machine.argv))
            };
            print_stdout(&text)?;
            Ok(Outcome::Pass)
        }
        GuestCommand::Variants {
            kernel,
            artifacts,
            variant,
        } => {
            let names: Vec<String> = if kernel.is_some() || artifacts.is_some() {
                given_kernels(kernel, artifacts, &variant, runtime)?
                    .into_iter()
                    .map(|(v, _)| v)
                    .collect()
            } else if variant.is_empty() {
                Variant::ALL.iter().map(|v| v.name().to_string()).collect()
            } else {
                variant.iter().map(|v| v.name().to_string()).collect()
            };
            print_stdout(&(names.join("\n") + "\n"))?;
            Ok(Outcome::Pass)
        }
        GuestCommand::Image { out, agent } => {
            let rec = crate::guest::image::image(paths, agent.as_deref(), out.as_deref())?;
            progress::info(&format!(
                "guest image {} ({}, agent {})",
                rec.sha256.get(..16).unwrap_or(""),
                images::human_size(rec.size_bytes),
                rec.agent
            ));
            println!("{}", rec.path.display());
            Ok(Outcome::Pass)
        }
    }
}

/// The kernels of `--kernel` or `--artifacts` (none when neither is given),
/// kept to the `--variant`s asked for (all when none is).
fn given_kernels(
    kernel: Option<PathBuf>,
    artifacts: Option<PathBuf>,
    variant: &[Variant],
    runtime: Runtime,
) -> Result<Vec<(String, PathBuf)>> {
    if kernel.is_none() && artifacts.is_none() {
        return Ok(vec![]);
    }
    let opts = crate::farm::TestOptions {
        kernel,
        artifacts,
        variant: (variant.len() == 1).then(|| variant[0]),
        ..crate::farm::TestOptions::new(runtime)
    };
    Ok(crate::farm::kernels(&opts)?
        .into_iter()
        .filter(|(v, _)| variant.is_empty() || variant.iter().any(|w| w.name() == v))
        .collect())
}
