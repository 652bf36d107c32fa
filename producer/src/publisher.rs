//! Publishing with publisher confirms and a deadline: a publish is done only once
//! the broker confirmed it and did not return it as unroutable.

use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection};

/// Why a publish did not land.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The message could not be routed (mandatory) and came back.
    #[error("returned by the broker as unroutable")]
    Returned,
    /// The broker refused it.
    #[error("nacked by the broker")]
    Nacked,
    /// The broker did not confirm in time.
    #[error("no confirm within {0:?}")]
    Timeout(Duration),
    /// The channel or connection failed.
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
}

/// Publishes on one confirm-mode channel; every publish waits for its confirm, with
/// a deadline, and a returned (unroutable) message counts as a failure.
#[derive(Clone, Debug)]
pub struct Publisher {
    channel: Channel,
    timeout: Duration,
}

impl Publisher {
    /// Open a confirm-mode channel on `conn`.
    pub async fn open(conn: &Connection, timeout: Duration) -> Result<Publisher, lapin::Error> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Publisher { channel, timeout })
    }

    /// Publish persistently and mandatorily; Ok only once the broker confirmed it and
    /// did not return it.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let properties = properties.with_delivery_mode(2);
        let work = async {
            let confirm = self
                .channel
                .basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    options,
                    body,
                    properties,
                )
                .await?;
            confirmed(confirm.await?)
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| PublishError::Timeout(self.timeout))?
    }
}

/// A publisher confirm as a result: a returned (unroutable) message is a failure.
pub fn confirmed(confirmation: Confirmation) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) => Err(PublishError::Returned),
        Confirmation::Nack(_) => Err(PublishError::Nacked),
    }
}
