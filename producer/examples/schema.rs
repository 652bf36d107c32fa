//! Print the job's JSON Schema: `cargo run -p quota-worker-producer --example schema`
//! (the checked-in `schema/job.schema.json` is this output; a test keeps them equal).
fn main() {
    let schema = quota_worker_producer::schema();
    println!("{}", serde_json::to_string_pretty(&schema).unwrap());
}
