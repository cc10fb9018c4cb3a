//! A client of the provider socket that behaves like the driver: HTTP/2 over the Unix
//! socket with `:authority localhost` (hyper's server resets streams whose authority is a
//! socket path, spec 6.1).

use std::path::Path;

use hyper_util::rt::TokioIo;

use crate::proto::csi_driver_provider_client::CsiDriverProviderClient;

/// The generated client over a tonic channel.
pub type Client = CsiDriverProviderClient<tonic::transport::Channel>;

/// Connects to the provider at `path`. The channel reconnects on demand.
pub async fn connect_unix(path: &Path) -> Result<Client, tonic::transport::Error> {
    let path = path.to_owned();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await?;
    Ok(CsiDriverProviderClient::new(channel))
}
