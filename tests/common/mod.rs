pub mod fake_model;
