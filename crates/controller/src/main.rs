//! `statefulset-drain-controller`: parses the command line and runs the controller.
fn main() {}
