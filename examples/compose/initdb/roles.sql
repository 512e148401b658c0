-- Runs once, when the postgres container initialises an empty data directory
-- (docker-entrypoint-initdb.d), as its superuser. Two roles, as docs/fencing.md asks:
-- broker_owner owns the database and runs the migrations; broker_app is what the API,
-- workers and reconciler connect as, granted by `effect-broker db grant` after each
-- migration: no TRUNCATE, no DELETE on the ledger, not an owner, so the ledger's
-- triggers bind it. The passwords are for a local stack: change them anywhere else.
CREATE ROLE broker_owner LOGIN PASSWORD 'broker-owner-local';
CREATE ROLE broker_app LOGIN PASSWORD 'broker-app-local';
CREATE DATABASE effect_broker OWNER broker_owner;
