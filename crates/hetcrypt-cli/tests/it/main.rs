//! The `hetcrypt` command's integration tests, in one test binary (libtest runs them in
//! parallel, and there is one link instead of one per file).

mod cli_support;
mod files_support;

mod cli_bench;
mod cli_calibrate;
mod cli_engines;
mod cli_help;
mod cli_speed;
mod files_buffers;
mod files_confinement;
mod files_dirs;
mod files_durability;
mod files_encrypt;
mod files_failures;
mod files_keygen;
mod files_permissions;
mod files_signals;
mod files_tree;
mod files_writers;
